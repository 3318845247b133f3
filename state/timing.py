"""The rules of time (DESIGN.md section 3) and the wheel's timer, as pure functions.
Every time here is the intake broker's; a host's clock enters only through
`correct_deliver_timestamps`, which allows `clock_tolerance` for the difference."""
from __future__ import annotations

import numpy as np


def correct_deliver_timestamps(now_ms: int, due_ms: np.ndarray, delay_ms: np.ndarray,
                               clock_tolerance_ms: int) -> np.ndarray:
    """RocketMQ's correctDeliverTimestamp across hosts (DESIGN.md section 3): a due time later
    than `now_ms + delay_ms` by more than `clock_tolerance_ms` means a clock moved; deliver now.
    The due time is the broker's clock and `now_ms` a host's: allowing the tolerance, not a
    measured offset, lets a host trailing the broker by up to it keep every due time. Both parse
    paths use this rule; the wheel fires on its watermark (the broker's clock), corrects nothing."""
    return np.where(due_ms > now_ms + delay_ms + clock_tolerance_ms, now_ms, due_ms)


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
    """Whether a message waits in the cold tier: only when its whole bucket starts beyond the
    near horizon, so a bucket already loaded into the wheel never gets new cold messages."""
    return bucket_start(due_ms, bucket_ms) > append_ms + near_horizon_ms


def timer_for(earliest_due_ms: int, lead_ms: int, watermark_ms: int) -> int:
    """Event-time timer for a group whose earliest pending message is due at earliest_due_ms.
    Spark refuses a timeout at or below the current watermark, so never go below it."""
    return max(earliest_due_ms - lead_ms, watermark_ms + 1)
