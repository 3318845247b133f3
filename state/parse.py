"""The parse stage over one Arrow batch of intake records: envelopes and wheel groups.

Arrow in, Arrow out (Spark's mapInArrow): the headers are read once as flat name and value
lists, and the user headers are cut out of them with array operations. Only the per-record rules
(`state.envelope`) run per row. The wheel's parse gets no body (no key, no value, only the
control headers: streaming/wheel/query.py) and returns INDEX_ENVELOPE; the dispatch tasks' parse
of records they read themselves passes key and value through untouched and returns ENVELOPE.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import headers as H
from state.columns import ENVELOPE, INDEX_ENVELOPE
from state.envelope import (TIMER_LEVEL, Kind, Rules, default_uniq_key, level_of, parse,
                            real_topic_of)
from state.placement import spread_slots
from state.timing import beyond_max_delay, correct_deliver_timestamps, in_the_past, is_cold
from state.wheel import BUCKET_COLD, BUCKET_NOW, group_of, timer_slots
from state.worker import settle

_CONTROL = pa.array(sorted(H.CONTROL_HEADERS), pa.string())
# The control headers of the common message, parsed for the whole batch at once (`_common`).
_COMMON = (H.REAL_TOPIC, H.UNIQ_KEY, *H.DELAY_HEADERS)
# A timer's value the batch path reads itself: plain digits, short enough that no sum below
# leaves int64 (other values, signs and spaces included, take the per-row rules).
_PLAIN_TIMER = "^[0-9]{1,15}$"
# The ENVELOPE columns the per-row path copies from an Envelope, by field.
_ENVELOPE_FIELDS = {"level": "level", "due_ms": "due_ms", "uniq_key": "uniq_key",
                    "topic": "real_topic", "qid": "real_qid", "reason": "reason",
                    "cancel_key": "cancel_key", "rolled": "rolled"}


def _flat_headers(headers: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Per-row header counts, and all rows' header names and values, flat (null rows: none)."""
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    names, values = headers.flatten().flatten()
    return counts.astype(np.int64), names, values


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


def _common(n: int, row_of: np.ndarray, control: np.ndarray, names: pa.Array, values: pa.Array,
            ipart: np.ndarray, ioff: np.ndarray, append: np.ndarray, rules: Rules,
            slot_ms: int, spread: int, now_ms: int, overdue_before_ms: int) -> dict:
    """`parse`, `group_of` and the overdue rule of `parse_batch`, at once, for the batch's
    common rows: REAL_TOPIC once, one delay header (DELAY or a timer's), UNIQ_KEY at most
    once, no other control header, and values the per-row rules take as they are. Returns the
    row numbers ("rows") and their ENVELOPE columns; every other row, and every value these
    checks are not sure of, takes the per-row rules. tests/unit/test_parse_fast.py holds the
    two paths equal."""
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
    # A timer's due time (`state.envelope._due`); one out of bounds takes the per-row rules,
    # which say why it is dead.
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
    """Each row's UNIQ_KEY: its header's value (at `key_at`, for the rows `keyed`), or the
    default from its intake position.

    A value is taken only when it is UTF-8 and its first and last bytes are printable ASCII
    other than space, so `strip()` would not change it (every character it removes starts below
    0x21 or at 0x80 and above); any other clears the row's `good` for the per-row rules."""
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
    cold = delay & is_cold(due, at, rules.near_horizon_ms, rules.cold_bucket_ms)
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
    }


def _per_row(rows: list[int], cols: dict[str, np.ndarray], starts: np.ndarray,
             names: pa.Array, values: pa.Array, numbers: dict[str, np.ndarray], rules: Rules,
             slot_ms: int, spread: int, now_ms: int, overdue_before_ms: int) -> np.ndarray:
    """`parse` and `group_of` for each of `rows` (the batch's rows the common path left),
    written into `cols`; returns which of the batch's rows are dead letters."""
    dead = np.zeros(len(starts) - 1, dtype=bool)
    if not rows:
        return dead
    name_list, value_list = names.to_pylist(), values.to_pylist()
    ipart, ioff, append = (numbers[name].tolist() for name in ("ipart", "ioff", "append_ms"))
    for i in rows:
        a, b = starts[i], starts[i + 1]
        env = parse(list(zip(name_list[a:b], value_list[a:b])), ipart[i], ioff[i], append[i],
                    rules, now_ms)
        kind = env.kind
        if kind == Kind.DELAY and env.level > 0 and not env.rolled \
                and env.due_ms < overdue_before_ms:
            kind = Kind.NOW
        cols["bucket"][i], cols["slot"][i] = group_of(
            kind, env.level, env.due_ms, ioff[i], slot_ms, spread,
            env.cancel_key if kind == Kind.CANCEL else env.uniq_key, timer_parts=rules.timer_parts)
        cols["kind"][i] = kind.value
        for column, attr in _ENVELOPE_FIELDS.items():
            cols[column][i] = getattr(env, attr)
        dead[i] = env.kind == Kind.DEAD
    return dead


def _mark_direct(cols: dict[str, np.ndarray], ioff: np.ndarray, rules: Rules,
                 direct_max_delay_ms: int, spread: int) -> None:
    """Kind.DIRECT for every good level message (not a timer, not rolled from the cold tier)
    whose level's delay is at most `direct_max_delay_ms`, immediate ones included: the dispatch
    tasks hold these themselves (streaming/dispatch/direct.py), due as the parse set them."""
    kind = cols["kind"]
    candidate = np.isin(kind, (Kind.NOW.value, Kind.DELAY.value)) & ~cols["rolled"].astype(bool)
    level = np.full(len(kind), -1, dtype=np.int64)
    level[candidate] = cols["level"][candidate].astype(np.int64)
    delays = np.asarray((0, *rules.level_delays_ms), dtype=np.int64)
    direct = (level >= 0) & (delays[np.clip(level, 0, len(delays) - 1)] <= direct_max_delay_ms)
    if direct.any():
        kind[direct] = Kind.DIRECT.value
        cols["bucket"][direct] = BUCKET_NOW
        cols["slot"][direct] = np.asarray(spread_slots(BUCKET_NOW, spread),
                                          dtype=np.int64)[ioff[direct] % spread]


def parse_batch(batch: pa.RecordBatch, rules: Rules, slot_ms: int, spread: int,
                now_ms: int, overdue_before_ms: int = 0, common: bool = True,
                direct_max_delay_ms: int = -1) -> pa.RecordBatch:
    """Intake columns (key, value, ipart, ioff, append_ms, headers) → ENVELOPE columns, or
without key and value → INDEX_ENVELOPE columns.

    A level message due before `overdue_before_ms` (when the checkpoint's query first started)
    goes out with the immediate messages, so a job started on a backlog sends it as it reads it.
    Since that held from the checkpoint's first batch, no such message is ever in the state, and
    a level still leaves in due order: its overdue messages in intake order (their due order),
    then the held ones. Timers (a cancel names their group) and messages rolled in from the
    cold tier keep to the wheel.

    `common=False` sends every row through the per-row rules, not `_common`'s whole-batch path
    (the tests compare both); `direct_max_delay_ms` >= 0 marks the short levels' messages
    Kind.DIRECT (`_mark_direct`)."""
    n = batch.num_rows
    counts, names, values = _flat_headers(batch.column("headers"))
    row_of = np.repeat(np.arange(n), counts)
    starts = np.concatenate(([0], np.cumsum(counts)))
    numbers = {name: batch.column(name).to_numpy(zero_copy_only=False).astype(np.int64)
               for name in ("ipart", "ioff", "append_ms")}
    # Which of the batch's headers are the contract's control headers (the rest are the user's).
    control = pc.fill_null(pc.is_in(names, value_set=_CONTROL), False).to_numpy(
        zero_copy_only=False)
    fast = _common(n, row_of, control, names, values, numbers["ipart"], numbers["ioff"],
                   numbers["append_ms"], rules, slot_ms, spread, now_ms, overdue_before_ms) \
        if common else {"rows": np.zeros(0, np.int64)}

    cols = {name: np.empty(n, dtype=object)
            for name in ("kind", "bucket", "slot", *_ENVELOPE_FIELDS)}
    taken = fast.pop("rows")
    for name, column in fast.items():
        cols[name][taken] = column
    cols["rolled"][taken] = False
    slow = np.ones(n, dtype=bool)
    slow[taken] = False
    dead = _per_row(np.flatnonzero(slow).tolist(), cols, starts, names, values, numbers, rules,
                    slot_ms, spread, now_ms, overdue_before_ms)
    if direct_max_delay_ms >= 0:
        _mark_direct(cols, numbers["ioff"], rules, direct_max_delay_ms, spread)

    arrays = {
        **{name: pa.array(cols[name], ENVELOPE.field(name).type) for name in cols},
        "append_ms": batch.column("append_ms").cast(pa.int64()),
        "ipart": batch.column("ipart").cast(pa.int32()),
        "ioff": batch.column("ioff").cast(pa.int64()),
    }
    schema = INDEX_ENVELOPE
    if "value" in batch.schema.names:
        hkeys, hvals = _user_headers(~control | dead[row_of], row_of, n, names, values)
        arrays.update(key=batch.column("key").cast(pa.binary()),
                      value=batch.column("value").cast(pa.binary()), hkeys=hkeys, hvals=hvals)
        schema = ENVELOPE
    return pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema)


def _user_headers(keep: np.ndarray, row_of: np.ndarray, n: int, names: pa.Array,
                  values: pa.Array) -> tuple[pa.ListArray, pa.ListArray]:
    """Each row's headers marked `keep` (every header but the contract's control headers, in
    order; a dead letter keeps all of its original headers) as two parallel lists."""
    offsets = pa.array(np.concatenate(([0], np.cumsum(np.bincount(row_of[keep], minlength=n)))),
                       pa.int32())
    mask = pa.array(keep)
    return (pa.ListArray.from_arrays(offsets, names.filter(mask)),
            pa.ListArray.from_arrays(offsets, values.filter(mask)))


def make_parser(rules: Rules, slot_ms: int, spread: int, overdue_before_ms: int = 0):
    """The function handed to mapInArrow."""

    def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        for batch in batches:
            yield parse_batch(batch, rules, slot_ms, spread, int(time.time() * 1000),
                              overdue_before_ms)

    return parse_batches
