"""Spark's progress reports → metrics and the consumer group: StreamingQueryListeners for one
query, each report read as Spark's own JSON."""
from __future__ import annotations

import json
import logging

from pyspark.sql.streaming import StreamingQueryListener

from sinks.metrics import Metrics, _offsets

log = logging.getLogger(__name__)


class ProgressJsonListener(StreamingQueryListener):
    failure = "could not read a progress report"

    def __init__(self, query_name: str):
        self._name = query_name

    def onQueryProgress(self, event) -> None:
        progress = json.loads(event.progress.json)
        if progress.get("name") != self._name:
            return
        try:
            self.observe(progress)
        except Exception:  # a listener's bug must never stop delivery
            log.exception(self.failure)

    def observe(self, progress: dict) -> None:
        raise NotImplementedError

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

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
