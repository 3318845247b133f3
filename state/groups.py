"""A wheel group's buckets and settings (state/wheel.py turns the wheel), kept apart from the
wheel's own imports (pandas, pyarrow, numpy) so the driver can name them cheaply."""
from __future__ import annotations

import zlib
from dataclasses import KW_ONLY, dataclass

BUCKET_NOW = 0
BUCKET_DEAD = -2
BUCKET_TIMER = -1  # == TIMER_LEVEL: timer messages share one bucket of slots
BUCKET_COLD = -3   # pass-through: to the cold tier


@dataclass(frozen=True)
class WheelConfig:
    """The wheel's settings (streaming/stages.py wheel_config_of); no defaults of its own."""
    _: KW_ONLY
    slot_ms: int
    lead_ms: int
    # Extra lead per message held: a burst due in one second needs a batch its size to leave,
    # and its dispatch task keeps every message until due, so firing early costs only memory.
    lead_per_message_us: int
    # Spark's watermark trails the newest append by this (streaming/job.py); added back here.
    watermark_delay_ms: int
    dlq_topic: str
    # The groups a timer slot is split into, by UNIQ_KEY (`part_of`).
    timer_parts: int
    # The groups a level's slot is spread over (the parse; the shuffle partitions), and the
    # longest level the dispatch tasks read from the intake themselves (-1: none), left out here.
    spread: int
    direct_max_delay_ms: int
    # Driver clock at query build (epoch ms; 0 = none): a new query's first watermark (Spark's is
    # 0), so a backlog's overdue messages fire in it; one value for all groups keeps due order.
    first_watermark_ms: int = 0

    def lead_for(self, messages: int, bucket: int) -> int:
        """How long before its earliest due time a group of this many messages fires; it grows
        with the whole slot's size, as all of a slot's parts fire in one batch."""
        parts = self.timer_parts if bucket == BUCKET_TIMER else 1
        return self.lead_ms + messages * parts * self.lead_per_message_us // 1000


def part_of(uniq_key: str, parts: int) -> int:
    """The timer group part of a message: a hash that is the same in every Python process."""
    return zlib.crc32(uniq_key.encode()) % parts
