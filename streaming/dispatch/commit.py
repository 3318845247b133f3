"""A dispatch task's commits: each source's commit point with the metadata a restart and the
driver's gauges read (streaming/dispatch/rules.py `Offsets`)."""
from __future__ import annotations

import json
import logging
import time

from confluent_kafka import KafkaException, TopicPartition

from streaming.dispatch.start import transient

log = logging.getLogger(__name__)


class Committing:
    """The committing part of a dispatch task (streaming/dispatch/task.py `_Task`)."""

    def _commit(self, final: bool = False) -> None:
        """Commit the commit point (a transient failure waits for the next). exactly_once: the
        transaction first, offsets every `offsets_interval_s` (rows read again: ledger skips)."""
        if self.txn:
            due = final or time.monotonic() - self._offsets_at >= self.config.offsets_interval_s
            # Taken first, so below what the commit delivers; only when due (a min over held rows).
            commits = self._commit_points() if due else []
            self._commit_transaction()
            if not due:
                return
            self._offsets_at = time.monotonic()
        else:
            commits = self._commit_points()
        try:
            self.consumer.commit(offsets=commits, asynchronous=False)
        except KafkaException as e:
            if not transient(e):
                raise
            log.warning("dispatch %d: commit failed (%s); the next one retries it",
                        self.partition, e)

    def _commit_points(self) -> list:
        commits = []
        for source, offsets in self.offsets.items():
            point, mark = offsets.commit_point(self.ledger_end)
            meta = {"ledger": mark}
            if source is None:   # the driver's gauges, and a beat for its liveness check
                meta["beat"] = time.monotonic_ns() // 1_000_000
                meta["held"] = {str(k): n for k, n in self.held.items() if n}
                if self.refired.batch is not None:
                    meta["batch"] = [self.refired.batch, self.refired.start]
                if self.skew.measured:
                    meta["clock_ms"] = round(self.skew.offset_ms())
            topic, part = (self.ready.topic, self.partition) if source is None else source
            commits.append(TopicPartition(topic, part, point, metadata=json.dumps(meta)))
        return commits
