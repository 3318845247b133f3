"""The parse stage's whole-batch path (state/parse.py): the common message's control headers
read for every row at once with array operations; what it is not sure of takes the per-row rules."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import headers as H
from state.envelope import TIMER_LEVEL, Kind, Rules, default_uniq_key, level_of, real_topic_of
from state.timing import beyond_max_delay, correct_deliver_timestamps, in_the_past, is_cold
from state.placement import spread_slots
from state.wheel import BUCKET_COLD, BUCKET_NOW, timer_slots

# The control headers of the common message, parsed for the whole batch at once (`common_rows`).
_COMMON = (H.REAL_TOPIC, H.UNIQ_KEY, *H.DELAY_HEADERS)
# A timer's value read here: plain digits, so short no sum below leaves int64 (else: per-row).
_PLAIN_TIMER = "^[0-9]{1,15}$"


def _header_of(mask: np.ndarray, row_of: np.ndarray, n: int, rows: np.ndarray) -> pa.Array:
    """For each of `rows`, the index of its header where `mask` holds (it has exactly one)."""
    at = np.nonzero(mask)[0]
    index = np.zeros(n, np.int64)
    index[row_of[at]] = at
    return pa.array(index[rows])


def _per_value(raw: pa.Array, decide: Callable) -> tuple[np.ndarray, np.ndarray]:
    """`decide` run once per distinct value of `raw` (None: not decided here): the decision
    per row (an object array) and whether there is one."""
    encoded = raw.dictionary_encode()
    decided = [decide(v) for v in encoded.dictionary.to_pylist()] + [None]
    codes = pc.fill_null(encoded.indices, len(decided) - 1).to_numpy(zero_copy_only=False)
    return (np.array(decided, dtype=object)[codes],
            np.array([d is not None for d in decided], dtype=bool)[codes])


def _printable(edge: pa.Array) -> pa.Array:
    """Whether each binary of at most one byte is one byte of printable ASCII other than space
    (0x21-0x7e): binaries compare byte by byte, and b"" sorts first."""
    return pc.and_(pc.greater_equal(edge, pa.scalar(b"\x21", pa.binary())),
                   pc.less_equal(edge, pa.scalar(b"\x7e", pa.binary())))


def common_rows(n: int, row_of: np.ndarray, control: np.ndarray, names: pa.Array,
                values: pa.Array, ipart: np.ndarray, ioff: np.ndarray, append: np.ndarray,
                rules: Rules, slot_ms: int, spread: int, now_ms: int,
                overdue_before_ms: int) -> dict:
    """`parse`, `group_of` and the overdue rule at once for the batch's common rows: REAL_TOPIC
    once, one delay header, UNIQ_KEY at most once, no other control header, and values the
    per-row rules take as they are. Returns their row numbers ("rows") and ENVELOPE columns;
    the rest take the per-row rules (tests/unit/test_parse_fast.py holds the two equal)."""
    which = {name: pc.fill_null(pc.equal(names, name), False).to_numpy(zero_copy_only=False)
             for name in _COMMON}
    count = {name: np.bincount(row_of[m], minlength=n) for name, m in which.items()}
    rows = np.nonzero((count[H.REAL_TOPIC] == 1) & (count[H.UNIQ_KEY] <= 1)
                      & (sum(count[name] for name in H.DELAY_HEADERS) == 1)
                      & (np.bincount(row_of[control], minlength=n) == sum(count.values())))[0]
    if not len(rows):
        return {"rows": rows}
    topics, good = _per_value(values.take(_header_of(which[H.REAL_TOPIC], row_of, n, rows)),
                              lambda raw: real_topic_of(raw, rules))
    delay_at = _header_of(np.logical_or.reduce([which[name] for name in H.DELAY_HEADERS]),
                          row_of, n, rows)
    delay_name, is_level, levels, timer_value = _delay_headers(names, values, delay_at, rules,
                                                               good)
    keyed = count[H.UNIQ_KEY][rows] == 1
    uniq = _uniq_keys(values, _header_of(which[H.UNIQ_KEY], row_of, n, rows[keyed]), keyed,
                      ipart[rows], ioff[rows], good)
    at = append[rows]
    # A timer's due time (`state.envelope._due`); out of bounds: the per-row rules say why dead.
    timer_due = np.where(delay_name == H.TIMER_DELIVER_MS, timer_value,
                         at + np.where(delay_name == H.TIMER_DELAY_SEC, timer_value * 1000,
                                       timer_value))
    good &= is_level | ~(beyond_max_delay(timer_due, at, rules.max_delay_ms)
                         | in_the_past(timer_due, at, rules.clock_tolerance_ms))
    good = np.nonzero(good)[0]
    return _placed(rows[good], topics[good], uniq[good], at[good], levels[good].astype(np.int64),
                   is_level[good], timer_due[good], ioff, rules, slot_ms, spread, now_ms,
                   overdue_before_ms)


def _delay_headers(names: pa.Array, values: pa.Array, delay_at: np.ndarray, rules: Rules,
                   good: np.ndarray) -> tuple:
    """Each row's delay header (at `delay_at`): its name, whether it is DELAY, the level (a
    DELAY's value decided once per distinct value) and a timer's value (as an array); a value
    the per-row rules must judge clears the row's `good`."""
    delay_name = names.take(delay_at).to_numpy(zero_copy_only=False)
    delay_raw = values.take(delay_at)
    is_level = delay_name == H.DELAY
    levels = np.full(len(delay_at), TIMER_LEVEL, dtype=object)
    if is_level.any():
        some = np.nonzero(is_level)[0]
        levels[some], good_level = _per_value(delay_raw.take(some),
                                              lambda raw: level_of(raw, rules))
        good[some] &= good_level
    timer_value = np.zeros(len(delay_at), dtype=np.int64)
    if not is_level.all():
        some = np.nonzero(~is_level)[0]
        raw = delay_raw.take(some)
        plain = pc.fill_null(pc.match_substring_regex(raw, _PLAIN_TIMER), False).to_numpy(
            zero_copy_only=False)
        timer_value[some[plain]] = pc.cast(raw.filter(pa.array(plain)).cast(pa.string()),
                                           pa.int64()).to_numpy(zero_copy_only=False)
        good[some[~plain]] = False
    return delay_name, is_level, levels, timer_value


def _uniq_keys(values: pa.Array, key_at: np.ndarray, keyed: np.ndarray, ipart: np.ndarray,
               ioff: np.ndarray, good: np.ndarray) -> np.ndarray:
    """Each row's UNIQ_KEY: its header's value (at `key_at`, for `keyed` rows) or the default.
    Taken only if UTF-8 with printable non-space ASCII first and last bytes, so `strip()` keeps
    it; any other value clears the row's `good` for the per-row rules."""
    uniq = np.empty(len(keyed), dtype=object)
    if keyed.any():
        raw = values.take(key_at)
        plain = pc.and_(_printable(pc.binary_slice(raw, 0, 1)),
                        _printable(pc.binary_slice(raw, -1, None)))
        plain = pc.fill_null(plain, False).to_numpy(zero_copy_only=False)
        try:
            uniq[keyed] = raw.cast(pa.string()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:   # some key is not UTF-8: the per-row rules say which
            plain[:] = False
        good[np.nonzero(keyed)[0][~plain]] = False
    default = np.nonzero(~keyed)[0]
    uniq[default] = [default_uniq_key(p, o) for p, o in zip(ipart[default].tolist(),
                                                              ioff[default].tolist())]
    return uniq


def _placed(rows, topics, uniq, at, level, is_level, timer_due, ioff, rules: Rules,
            slot_ms: int, spread: int, now_ms: int, overdue_before_ms: int) -> dict:
    """The good common rows' ENVELOPE columns: due time, kind, and wheel group."""
    delays = np.asarray(rules.level_delays_ms, dtype=np.int64)[np.maximum(level, 1) - 1]
    due = np.where(level > 0, correct_deliver_timestamps(now_ms, at + delays, delays,
                                                         rules.clock_tolerance_ms),
                   np.where(is_level, at, np.maximum(timer_due, at)))
    delay = (level != 0) & (due > at)
    ringed = (level < 0) & rules.rolls_to_ring   # state/envelope.py _parse_control
    cold = delay & np.where(ringed, due - at > rules.ring_horizon_ms,
                            is_cold(due, at, rules.near_horizon_ms, rules.cold_bucket_ms))
    delay &= ~cold & ((due >= overdue_before_ms) | (level < 0))
    kind = np.where(cold, Kind.COLD.value, np.where(delay, Kind.DELAY.value, Kind.NOW.value))
    spread_of = {b: np.asarray(spread_slots(b, spread), dtype=np.int64)[ioff[rows] % spread]
                 for b in (BUCKET_NOW, BUCKET_COLD)}
    slot = np.where(delay, due // slot_ms,
                    np.where(cold, spread_of[BUCKET_COLD], spread_of[BUCKET_NOW]))
    timers = np.nonzero(delay & (level < 0))[0]
    if len(timers):
        slot[timers] = timer_slots(due[timers], uniq[timers], slot_ms, spread, rules.timer_parts)
    return {
        "rows": rows, "kind": kind.astype(object), "level": level, "due_ms": due,
        "bucket": np.where(delay, level, np.where(cold, BUCKET_COLD, BUCKET_NOW)),
        "slot": slot, "uniq_key": uniq, "topic": topics,
        # streaming/dispatch/direct.py due_after: no clock's correction, a past time as it is
        "after": np.where(is_level, np.where(level > 0, delays, 0), timer_due - at),
        "timer": ~is_level,
    }
