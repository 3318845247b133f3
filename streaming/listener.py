"""Spark's progress reports → metrics and the consumer group: StreamingQueryListeners for one
query, handed each report as Spark's own JSON.

PySpark turns every listener event into Python objects field by field, one call into the JVM
per field and per metric (`StreamingQueryProgress.fromJObject`): 55-70 ms per report and
listener, measured on this host, on the driver's Python and its gateway while the next batch
starts. Asking the JVM for the report's JSON is one call (0.6 ms), and JSON is what both
listeners read anyway.
"""
from __future__ import annotations

import json
import logging

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener

from sinks.metrics import Metrics, _offsets

log = logging.getLogger(__name__)


class _JsonEvents(JStreamingQueryListener):
    """The Python side of Spark's listener wrapper: a progress report goes to
    `on_progress` as a dict; the other events, which these listeners ignore, are not
    converted at all."""

    def onQueryStarted(self, jevent) -> None:
        pass

    def onQueryProgress(self, jevent) -> None:
        self.pylistener.on_progress(json.loads(jevent.progress().json()))

    def onQueryIdle(self, jevent) -> None:
        pass

    def onQueryTerminated(self, jevent) -> None:
        pass


class ProgressJsonListener(StreamingQueryListener):
    """A listener of one query's progress reports, each as the dict of Spark's JSON."""

    def __init__(self, query_name: str):
        self._name = query_name

    @property
    def _jlistener(self):
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(
                _JsonEvents(self))
        return self._jlistenerobj

    def on_progress(self, progress: dict) -> None:
        if progress.get("name") == self._name:
            self.observe(progress)

    def observe(self, progress: dict) -> None:
        raise NotImplementedError

    # StreamingQueryListener's abstract methods; _JsonEvents never calls them.
    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        self.on_progress(json.loads(event.progress.json))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


class ProgressListener(ProgressJsonListener):
    def __init__(self, metrics: Metrics, query_name: str, late_tolerance_ms: int,
                 intake_topic: str, heartbeats: int | None = None):
        super().__init__(query_name)
        self._metrics = metrics
        self._late_tolerance_ms = late_tolerance_ms
        self._intake = intake_topic
        self._heartbeats = heartbeats

    def observe(self, progress: dict) -> None:
        try:
            self._metrics.observe_progress(progress, self._late_tolerance_ms, self._intake,
                                           heartbeats=self._heartbeats)
        except Exception:  # a metrics bug must never stop delivery
            log.exception("could not read a progress report into metrics")


class OffsetMirror(ProgressJsonListener):
    """After each batch, the intake offsets it committed go to the job's consumer group
    (`streaming.checkpoint.mirror_offsets`): lag shows in standard Kafka tools, and a lost
    checkpoint is noticed at the next start."""

    def __init__(self, query_name: str, intake_topic: str, commit):
        super().__init__(query_name)
        self._intake = intake_topic
        self._commit = commit
        self._last: dict[int, int] = {}

    def observe(self, progress: dict) -> None:
        try:
            offsets: dict[int, int] = {}
            for source in progress.get("sources", []):
                offsets.update(_offsets(source.get("endOffset"), self._intake))
            if offsets and offsets != self._last:
                self._commit(offsets)
                self._last = offsets
        except Exception:  # the mirror is a convenience; it must never stop delivery
            log.exception("could not mirror the intake offsets to the consumer group")
