"""The rules of time (DESIGN.md section 3) and the wheel's slot arithmetic. Pure functions, each
written once: those the parse applies to whole batches take numpy arrays (and plain ints).
Every time here is the intake broker's (append times, due times); a host's clock enters only
through `correct_deliver_timestamps`, which allows `clock_tolerance` for the difference."""
from __future__ import annotations

import numpy as np


def correct_deliver_timestamps(now_ms: int, due_ms: np.ndarray, delay_ms: np.ndarray,
                               clock_tolerance_ms: int) -> np.ndarray:
    """RocketMQ's correctDeliverTimestamp across hosts (DESIGN.md section 3): a due time later
    than `now_ms + delay_ms` by more than `clock_tolerance_ms` means a clock moved; deliver
    now instead.

    RocketMQ compares two readings of one broker clock, so its rule fires only after that clock
    jumped. Here the due time comes from the intake broker's clock (its append time) and
    `now_ms` from the clock of the host that parses or fires, which differ by their offset: the
    rule allows the tolerance rather than a measured offset, so a host whose clock trails the
    broker's by up to `clock_tolerance` keeps every due time (append time + delay) as it is.
    Both of the parse's paths take this one rule, in the wheel and in the dispatch tasks'
    direct read (which passes the broker's clock as it measured it). The wheel fires on its
    watermark, the broker's clock, and corrects nothing."""
    return np.where(due_ms > now_ms + delay_ms + clock_tolerance_ms, now_ms, due_ms)


def correct_deliver_timestamp(now_ms: int, due_ms: int, delay_ms: int,
                              clock_tolerance_ms: int) -> int:
    """correct_deliver_timestamps for one message."""
    return int(correct_deliver_timestamps(now_ms, due_ms, delay_ms, clock_tolerance_ms))


def beyond_max_delay(due_ms, append_ms, max_delay_ms: int):
    """Whether a timer is due further than `max_delay` after its append (dead-lettered)."""
    return due_ms - append_ms > max_delay_ms


def in_the_past(due_ms, append_ms, clock_tolerance_ms: int):
    """Whether a timer is due before its append by more than the clock tolerance (dead-lettered);
    one due less far in the past is due at its append."""
    return due_ms < append_ms - clock_tolerance_ms


def bucket_start(ms, bucket_ms: int):
    """Start of the cold-tier bucket of `ms` (an int or an array)."""
    return ms - ms % bucket_ms


def is_cold(due_ms, append_ms, near_horizon_ms: int, bucket_ms: int):
    """Whether a message waits in the cold tier (ints or arrays): only when its whole bucket
    starts beyond the near horizon, so a bucket that has come near (and been loaded into the
    wheel) never receives new cold messages by this rule."""
    return bucket_start(due_ms, bucket_ms) > append_ms + near_horizon_ms


def slot_of(due_ms: int, slot_ms: int) -> int:
    """The wheel slot a due time falls in: slots are `slot_ms` wide, aligned to the epoch."""
    return due_ms // slot_ms


def fire_horizon(watermark_ms: int, lead_ms: int) -> int:
    """Messages due at or before this are released to the dispatch in this batch.

    The watermark trails the real clock by a batch or two; firing `lead_ms` ahead lets a
    message reach its dispatch task before it is due. One horizon for every group, not the
    clock, keeps a level in due order: a group is called when its timer (earliest - lead) is
    under the watermark, so a batch releases exactly the messages due up to the horizon."""
    return watermark_ms + lead_ms


def timer_for(earliest_due_ms: int, lead_ms: int, watermark_ms: int) -> int:
    """Event-time timer for a group whose earliest pending message is due at earliest_due_ms.
    Spark refuses a timeout at or below the current watermark, so never go below it."""
    return max(earliest_due_ms - lead_ms, watermark_ms + 1)
