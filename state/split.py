"""The split of the intake between the wheel and the dispatch tasks (DESIGN.md section 4, the direct
window): a rule of the record alone (headers, append time, position), never of a clock, so both
sides always agree. A dispatch task takes what `is_direct` says (streaming/dispatch/direct.py);
the wheel leaves those out but for cancels, which it reads too (streaming/dispatch/cancels.py):
the JVM drops the plainest at once (streaming/wheel/query.py `surely_direct`), its parse the
rest (state/parse.py)."""
from __future__ import annotations

from state import headers as H
from state.envelope import Rules, is_legacy
from state.values import fits_long, long_of

# The service's own records stay with the wheel.
SERVICE_HEADERS = (H.HEARTBEAT, H.ROLLED)
# A timer's ROLLED value: its level (state/envelope.py TIMER_LEVEL), then its seal.
ROLLED_TIMER = b"-1:"
# The split of the delayq before (Rules.legacy_before): short levels' exact DELAY values only.
LEGACY_WHEEL_HEADERS = frozenset((*H.TIMER_HEADERS, H.TIMER_DEL_UNIQKEY, *SERVICE_HEADERS))


def due_after(headers: list | None, append_ms: int, level_delays_ms: tuple[int, ...],
              rolled_timers: bool = False) -> tuple[int | None, bool]:
    """How long after its append a record is due, by its headers alone (a cancel: its target,
    by its TIMER_DELIVER_MS), as `parse` reads them, and whether it is a timer (or a timer's
    cancel: no DELAY); None where the wheel decides: a service record (but a timer the cold tier
    rolled, with `rolled_timers`: Rules.rolls_to_ring), several delay headers, a value `parse`
    refuses or a sum beyond a long."""
    delays, cancel = [], False
    for name, value in headers or ():
        if name in SERVICE_HEADERS:
            if name == H.ROLLED and rolled_timers and (value or b"").startswith(ROLLED_TIMER):
                continue   # placed by its TIMER_DELIVER_MS, sealed with it (state/seal.py)
            return None, False
        if name == H.TIMER_DEL_UNIQKEY:
            cancel = True
        elif name in H.DELAY_HEADERS:
            delays.append((name, value))
    timer = not any(name == H.DELAY for name, _ in delays)
    if cancel:
        delays = [d for d in delays if d[0] == H.TIMER_DELIVER_MS] or delays
    if len(delays) != 1:
        return (None if delays else 0), False
    name, value = delays[0][0], long_of(delays[0][1])
    if value is None:
        return None, False
    if name == H.DELAY:
        return (None if value < 0 else
                (0, *level_delays_ms)[min(value, len(level_delays_ms))]), False
    if name == H.TIMER_DELAY_MS:
        return value, timer
    after = value * 1000 if name == H.TIMER_DELAY_SEC else value - append_ms
    return (after, timer) if fits_long(after) else (None, False)


def is_direct(headers: list | None, append_ms: int, partition: int, offset: int, rules: Rules,
              direct_max_delay_ms: int) -> bool:
    """Whether a dispatch task takes this intake record itself: due within the window of its
    append (`due_after`; negative window: none), or a timer (or its cancel, or a timer the cold
    tier rolled) due within the ring's horizon (Rules.ring_horizon_ms). Parses as NOW, DELAY,
    CANCEL or DEAD."""
    if direct_max_delay_ms < 0:
        return False
    if is_legacy(rules, partition, offset):
        values = legacy_values(rules, direct_max_delay_ms)
        return not any(name in LEGACY_WHEEL_HEADERS or (name == H.DELAY and value not in values)
                       for name, value in headers or ())
    after, timer = due_after(headers, append_ms, rules.level_delays_ms, rules.rolls_to_ring)
    return after is not None and (after <= direct_max_delay_ms
                                  or timer and after <= rules.ring_horizon_ms)


def legacy_values(rules: Rules, direct_max_delay_ms: int) -> frozenset[bytes]:
    """The older split's DELAY values ("0", "1", …): the levels of at most the window."""
    return frozenset(str(level).encode() for level, delay in
                     enumerate((0, *rules.level_delays_ms)) if delay <= direct_max_delay_ms)
