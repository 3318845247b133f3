"""The batch-sink contract: every sink of the wheel query (sinks/ready.py, sinks/cold.py,
sinks/ledger.py) writes one micro-batch, identified by its batch id.

A sink may be called again with the same batch id after a crash (Spark replays a batch whose
commit it did not record); each sink documents what it guarantees then.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from state.reasons import reason_label


@dataclass
class BatchSummary:
    """Counts of one batch's output, computed once and shared by every sink and the metrics."""

    batch_id: int
    by_kind: dict[str, int] = field(default_factory=dict)
    delivered_by_level: dict[int, int] = field(default_factory=dict)
    dead_by_reason: dict[str, int] = field(default_factory=dict)
    received_by_level: dict[int, int] = field(default_factory=dict)
    pending_delta_by_level: dict[int, int] = field(default_factory=dict)
    # (cumulative counts per lateness bucket, total, sum of seconds) of this batch's deliveries
    lateness: tuple[list[int], int, float] | None = None
    # seconds spent per step of the batch, for profiling (step -> seconds)
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, level: int | None, reason: str | None, count: int,
            received: int = 0, pending_delta: int = 0, delivered: bool = True) -> None:
        if kind == "tally":
            self.received_by_level[level] = self.received_by_level.get(level, 0) + received
            self.pending_delta_by_level[level] = \
                self.pending_delta_by_level.get(level, 0) + pending_delta
            return
        self.by_kind[kind] = self.by_kind.get(kind, 0) + count
        if kind == "deliver" and delivered:
            self.delivered_by_level[level] = self.delivered_by_level.get(level, 0) + count
        elif kind == "dead":
            label = reason_label(reason)
            self.dead_by_reason[label] = self.dead_by_reason.get(label, 0) + count

    @property
    def sends(self) -> int:
        """Rows this batch writes to Kafka."""
        return self.count("deliver") + self.count("dead")

    def count(self, kind: str) -> int:
        return self.by_kind.get(kind, 0)

    def recount(self, kind: str, as_kind: str, count: int) -> None:
        """Move `count` rows counted as `kind` to `as_kind` (a cancel miss parked in the cold
        tier is no miss until its bucket rolls)."""
        if count:
            self.by_kind[kind] = self.by_kind.get(kind, 0) - count
            self.by_kind[as_kind] = self.by_kind.get(as_kind, 0) + count


class Sent:
    """What a batch sent: `frame()` is a DataFrame of the sent rows (the OUTPUT layout plus
    `sent_ms`, the moment each row was written to Kafka), built on first use: most batches
    never need it (dead letters are rare), and building it costs the driver an analysis of
    the micro-batch's whole plan."""

    def __init__(self, build: Callable[[], object]):
        self._build = build
        self._frame = None

    def frame(self):
        if self._frame is None:
            self._frame = self._build()
        return self._frame
