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
    """The wheel's settings (conf/defaults.toml, through streaming/stages.py
    wheel_config_of): no defaults of its own."""
    _: KW_ONLY
    slot_ms: int
    lead_ms: int
    # A group fires this much earlier again per message it holds: a large group (a burst of
    # timers due in the same second) needs a batch of its own size to leave, and its dispatch
    # task keeps every message until due, so firing it early costs nothing but memory.
    lead_per_message_us: int
    # The Spark watermark trails the newest append time by this much (see streaming/job.py);
    # the wheel adds it back so its own arithmetic is in real time.
    watermark_delay_ms: int
    dlq_topic: str
    # The groups a timer slot is split into, by UNIQ_KEY (`part_of`).
    timer_parts: int
    # The driver's clock when the query was built (epoch ms; 0 = none): the watermark of a new
    # query's first batch (Spark passes 0), so a backlog's overdue messages fire in it. One value
    # for every group, all called in that batch, so due order is kept (see fire_horizon).
    first_watermark_ms: int = 0

    def lead_for(self, messages: int, bucket: int) -> int:
        """How long before its earliest due time a group of this many messages fires. The
        group is one of its bucket's equal parts of a slot, which all fire in one batch, so the
        lead grows with the slot's size."""
        parts = self.timer_parts if bucket == BUCKET_TIMER else 1
        return self.lead_ms + messages * parts * self.lead_per_message_us // 1000


def part_of(uniq_key: str, parts: int) -> int:
    """The timer group part of a message: a hash that is the same in every Python process."""
    return zlib.crc32(uniq_key.encode()) % parts
