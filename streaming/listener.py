"""Spark's progress reports → metrics: a StreamingQueryListener for one query."""
from __future__ import annotations

import json
import logging

from pyspark.sql.streaming import StreamingQueryListener

from sinks.metrics import Metrics, _offsets

log = logging.getLogger(__name__)


class ProgressListener(StreamingQueryListener):
    def __init__(self, metrics: Metrics, query_name: str, late_tolerance_ms: int,
                 intake_topic: str):
        self._metrics = metrics
        self._name = query_name
        self._late_tolerance_ms = late_tolerance_ms
        self._intake = intake_topic

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self._name:
            return
        try:
            self._metrics.observe_progress(json.loads(progress.json), self._late_tolerance_ms,
                                           self._intake)
        except Exception:  # a metrics bug must never stop delivery
            log.exception("could not read a progress report into metrics")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


class OffsetMirror(StreamingQueryListener):
    """After each batch, the intake offsets it committed go to the job's consumer group
    (`streaming.checkpoint.mirror_offsets`): lag shows in standard Kafka tools, and a lost
    checkpoint is noticed at the next start."""

    def __init__(self, query_name: str, intake_topic: str, commit):
        self._name = query_name
        self._intake = intake_topic
        self._commit = commit
        self._last: dict[int, int] = {}

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self._name:
            return
        try:
            offsets: dict[int, int] = {}
            for source in json.loads(progress.json).get("sources", []):
                offsets.update(_offsets(source.get("endOffset"), self._intake))
            if offsets and offsets != self._last:
                self._commit(offsets)
                self._last = offsets
        except Exception:  # the mirror is a convenience; it must never stop delivery
            log.exception("could not mirror the intake offsets to the consumer group")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
