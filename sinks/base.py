"""The batch-sink contract: every sink writes one micro-batch, identified by its batch id.

A sink's `write_batch` may be called again with the same batch id after a crash (Spark
replays a batch whose commit it did not record); each sink documents what it guarantees then.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class BatchSummary:
    """Counts of one batch's output, computed once and shared by every sink and the metrics."""

    batch_id: int
    by_kind: dict[str, int] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)
    delivered_by_level: dict[int, int] = field(default_factory=dict)
    dead_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.by_kind.values())

    def count(self, kind: str) -> int:
        return self.by_kind.get(kind, 0)


class BatchSink(ABC):
    name: str = "sink"

    @abstractmethod
    def write_batch(self, batch, summary: BatchSummary) -> None:
        """Write the batch's rows (a persisted DataFrame of the OUTPUT layout)."""
