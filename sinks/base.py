"""The batch summary the wheel query's sinks and the metrics share. A sink may get a batch id
again after a crash (Spark replays an unrecorded batch); each sink documents what it guarantees."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from state.reasons import reason_label


@dataclass
class BatchSummary:
    """Counts of one batch's output, computed once and shared by every sink and the metrics."""

    batch_id: int
    by_kind: Counter[str] = field(default_factory=Counter)
    delivered_by_level: Counter[int] = field(default_factory=Counter)
    dead_by_reason: Counter[str] = field(default_factory=Counter)
    received_by_level: Counter[int] = field(default_factory=Counter)
    pending_delta_by_level: Counter[int] = field(default_factory=Counter)
    # (cumulative counts per lateness bucket, total, sum of seconds) of this batch's deliveries
    lateness: tuple[list[int], int, float] | None = None
    # seconds spent per step of the batch, for profiling (step -> seconds)
    timings: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, level: int | None, reason: str | None, count: int,
            received: int = 0, pending_delta: int = 0, delivered: bool = True) -> None:
        if kind == "tally":
            self.received_by_level[level] += received
            self.pending_delta_by_level[level] += pending_delta
            return
        self.by_kind[kind] += count
        if kind == "deliver" and delivered:
            self.delivered_by_level[level] += count
        elif kind == "dead":
            self.dead_by_reason[reason_label(reason)] += count

    def count(self, kind: str) -> int:
        return self.by_kind[kind]

    def recount(self, kind: str, as_kind: str, count: int) -> None:
        """Move `count` rows counted as `kind` to `as_kind` (a cancel miss parked in the cold
        tier is no miss until its bucket rolls)."""
        if count:
            self.by_kind[kind] -= count
            self.by_kind[as_kind] += count
