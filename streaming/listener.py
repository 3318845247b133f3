"""Spark's progress reports → metrics and the consumer group: StreamingQueryListeners for one
query, handed each report as Spark's own JSON.

PySpark builds each report's Python objects field by field, one JVM call per field, on the
driver while the next batch starts; the report's JSON is one call, and JSON is what these
listeners read anyway.
"""
from __future__ import annotations

import json
import logging
from functools import cached_property

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener

from sinks.metrics import Metrics, _offsets

log = logging.getLogger(__name__)


class _JsonEvents(JStreamingQueryListener):
    """Spark's listener wrapper that hands `on_progress` a progress report as a dict and
    converts none of the other events, which these listeners ignore."""

    def onQueryStarted(self, jevent) -> None:
        pass

    def onQueryProgress(self, jevent) -> None:
        self.pylistener.on_progress(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent) -> None:
        pass

    def onQueryTerminated(self, jevent) -> None:
        pass


class ProgressJsonListener(StreamingQueryListener):
    failure = "could not read a progress report"

    def __init__(self, query_name: str):
        self._name = query_name

    @cached_property   # one JVM wrapper, so that removeListener finds the one added
    def _jlistener(self):
        from pyspark import SparkContext

        return SparkContext._jvm.PythonStreamingQueryListenerWrapper(_JsonEvents(self))

    def on_progress(self, progress: dict) -> None:
        if progress.get("name") != self._name:
            return
        try:
            self.observe(progress)
        except Exception:  # a listener's bug must never stop delivery
            log.exception(self.failure)

    def observe(self, progress: dict) -> None:
        raise NotImplementedError

    # StreamingQueryListener's abstract methods; _JsonEvents calls none of them.
    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        self.on_progress(json.loads(event.progress.json))

    def onQueryTerminated(self, event) -> None:
        pass


class ProgressListener(ProgressJsonListener):
    failure = "could not read a progress report into metrics"

    def __init__(self, metrics: Metrics, query_name: str, late_tolerance_ms: int,
                 intake_topic: str, heartbeats: int | None = None):
        super().__init__(query_name)
        self._metrics = metrics
        self._late_tolerance_ms = late_tolerance_ms
        self._intake = intake_topic
        self._heartbeats = heartbeats

    def observe(self, progress: dict) -> None:
        self._metrics.observe_progress(progress, self._late_tolerance_ms, self._intake,
                                       heartbeats=self._heartbeats)


class OffsetMirror(ProgressJsonListener):
    """After each batch, the intake offsets it committed go to the job's consumer group:
    lag shows in standard Kafka tools, and a lost checkpoint is noticed at the next start."""

    failure = "could not mirror the intake offsets to the consumer group"

    def __init__(self, query_name: str, intake_topic: str, commit):
        super().__init__(query_name)
        self._intake = intake_topic
        self._commit = commit
        self._last: dict[int, int] = {}

    def observe(self, progress: dict) -> None:
        offsets: dict[int, int] = {}
        for source in progress.get("sources", []):
            offsets.update(_offsets(source.get("endOffset"), self._intake))
        if offsets and offsets != self._last:
            self._commit(offsets)
            self._last = offsets
