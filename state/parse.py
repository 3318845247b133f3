"""The parse stage over one Arrow batch of intake records (mapInArrow): envelopes and wheel
groups. The wheel's parse gets no body and returns INDEX_ENVELOPE; the dispatch tasks' parse passes
key and value through and returns ENVELOPE. Only `state.envelope`'s rules run per row."""
from __future__ import annotations

import logging
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import headers as H
from state.columns import ENVELOPE, INDEX_ENVELOPE
from state.envelope import Envelope, Kind, Rules, default_uniq_key, parse
from state.common import common_rows
from state.errors import ParseError
from state.reasons import reason
from state.split import is_direct
from state.wheel import group_of
from state.worker import settle

_CONTROL = pa.array(sorted(H.CONTROL_HEADERS), pa.string())
# The ENVELOPE columns the per-row path copies from an Envelope, by field.
_ENVELOPE_FIELDS = {"level": "level", "due_ms": "due_ms", "uniq_key": "uniq_key",
                    "topic": "real_topic", "qid": "real_qid", "reason": "reason",
                    "cancel_key": "cancel_key", "rolled": "rolled"}
# Bits of the integer ENVELOPE columns a per-row decision fills.
_BITS = {"level": 32, "qid": 32, "bucket": 32, "due_ms": 64, "slot": 64}

log = logging.getLogger(__name__)


def _flat_headers(headers: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Per-row header counts, and all rows' header names and values, flat (null rows: none)."""
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    names, values = headers.flatten().flatten()
    return counts.astype(np.int64), names, values


def _per_row(rows: list[int], cols: dict[str, np.ndarray], starts: np.ndarray,
             names: pa.Array, values: pa.Array, numbers: dict[str, np.ndarray], rules: Rules,
             slot_ms: int, spread: int, now_ms: int, overdue_before_ms: int,
             direct: np.ndarray | None = None, window_ms: int = -1) -> np.ndarray:
    """`parse` and `group_of` for each of `rows` (the batch's rows the common path left),
    written into `cols`; returns which of the batch's rows are dead letters. With `direct`,
    each row's `is_direct` (the dispatch tasks take it) into it."""
    dead = np.zeros(len(starts) - 1, dtype=bool)
    if not rows:
        return dead
    name_list, value_list = names.to_pylist(), values.to_pylist()
    ipart, ioff, append = (numbers[name].tolist() for name in ("ipart", "ioff", "append_ms"))
    for i in rows:
        headers = list(zip(name_list[starts[i]:starts[i + 1]], value_list[starts[i]:starts[i + 1]]))
        if direct is not None:
            direct[i] = is_direct(headers, append[i], ipart[i], ioff[i], rules, window_ms)
        try:
            env = parse(headers, ipart[i], ioff[i], append[i], rules, now_ms)
            kind = env.kind
            if kind == Kind.DELAY and env.level > 0 and not env.rolled \
                    and env.due_ms < overdue_before_ms:
                kind = Kind.NOW
            cols["bucket"][i], cols["slot"][i] = group_of(
                kind, env.level, env.due_ms, ioff[i], slot_ms, spread,
                env.cancel_key if kind == Kind.CANCEL else env.uniq_key,
                timer_parts=rules.timer_parts)
            _fits(env, cols["bucket"][i], cols["slot"][i])
        except Exception as exc:   # one record's fault is its dead letter, never the batch's
            log.exception("intake record %d:%d: the parse failed", ipart[i], ioff[i])
            env = Envelope(Kind.DEAD, default_uniq_key(ipart[i], ioff[i]), reason=reason(
                "unparsable", f"the parse failed on this record ({type(exc).__name__}: "
                f"{str(exc)[:200]}); please report it"))
            kind = Kind.DEAD
            cols["bucket"][i], cols["slot"][i] = group_of(kind, 0, 0, ioff[i], slot_ms, spread,
                                                          timer_parts=rules.timer_parts)
        cols["kind"][i] = kind.value
        for column, attr in _ENVELOPE_FIELDS.items():
            cols[column][i] = getattr(env, attr)
        dead[i] = env.kind == Kind.DEAD
    return dead


def _common_split(n: int, taken: np.ndarray, after, timer, slow: np.ndarray,
                  numbers: dict[str, np.ndarray], rules: Rules, window_ms: int) -> np.ndarray:
    """state/split.py `is_direct` of the common rows at once (their due time after append and
    whether each is a timer); a row of the older split's takes the per-row rules (`slow`)."""
    direct = np.zeros(n, dtype=bool)
    if len(taken):
        direct[taken] = (window_ms >= 0) & ((after <= window_ms)
                                            | (timer & (after <= rules.ring_horizon_ms)))
        if rules.legacy_before:   # state/envelope.py `is_legacy`, for the batch at once
            before = np.asarray(rules.legacy_before, dtype=np.int64)
            part, off = numbers["ipart"][taken], numbers["ioff"][taken]
            known = part < len(before)
            slow[taken[known & (off < before[np.where(known, part, 0)])]] = True
    return direct


def _fits(env: Envelope, bucket: int, slot: int) -> None:
    """Raises unless every number fits its ENVELOPE column."""
    for name, value in (("level", env.level), ("qid", env.real_qid), ("bucket", bucket),
                        ("due_ms", env.due_ms), ("slot", slot)):
        if value is not None and not -2 ** (_BITS[name] - 1) <= value < 2 ** (_BITS[name] - 1):
            raise ValueError(f"{name} {value} does not fit {_BITS[name]} bits")


def parse_batch(batch: pa.RecordBatch, rules: Rules, slot_ms: int, spread: int,
                now_ms: int, overdue_before_ms: int = 0, common: bool = True,
                window_ms: int | None = None) -> pa.RecordBatch:
    """Intake columns (key, value, ipart, ioff, append_ms, headers) → ENVELOPE columns (without
    key and value: INDEX_ENVELOPE). A level due before `overdue_before_ms` (the checkpoint's first
    start) goes out with the immediate ones, so a backlog leaves as read, in due order. With
    `window_ms` (the wheel's parse), what the dispatch tasks take but cancels is left out
    (state/split.py). `common=False`: all by the per-row rules (tests compare both paths)."""
    n = batch.num_rows
    counts, names, values = _flat_headers(batch.column("headers"))
    row_of = np.repeat(np.arange(n), counts)
    starts = np.concatenate(([0], np.cumsum(counts)))
    numbers = {name: batch.column(name).to_numpy(zero_copy_only=False).astype(np.int64)
               for name in ("ipart", "ioff", "append_ms")}
    control = pc.fill_null(pc.is_in(names, value_set=_CONTROL), False).to_numpy(False)
    fast = common_rows(n, row_of, control, names, values, numbers["ipart"], numbers["ioff"],
                       numbers["append_ms"], rules, slot_ms, spread, now_ms, overdue_before_ms) \
        if common else {"rows": np.zeros(0, np.int64)}
    cols = {name: np.empty(n, dtype=object)
            for name in ("kind", "bucket", "slot", *_ENVELOPE_FIELDS)}
    taken, after, timer = fast.pop("rows"), fast.pop("after", None), fast.pop("timer", None)
    for name, column in fast.items():
        cols[name][taken] = column
    cols["rolled"][taken] = False
    slow = np.ones(n, dtype=bool)
    slow[taken] = False
    direct = None if window_ms is None else _common_split(
        n, taken, after, timer, slow, numbers, rules, window_ms)
    dead = _per_row(np.flatnonzero(slow).tolist(), cols, starts, names, values, numbers, rules,
                    slot_ms, spread, now_ms, overdue_before_ms, direct,
                    -1 if window_ms is None else window_ms)
    try:
        out = _envelopes(batch, cols, ~control | dead[row_of], row_of, names, values)
    except (pa.ArrowException, OverflowError, ValueError) as exc:
        raise ParseError(
            f"the parse of intake records {_positions(numbers)} failed as a whole ({exc}). No "
            f"rule of one record explains it, so the job stops rather than skip them; they "
            f"stay in the intake. Report it with these positions.") from exc
    return out if direct is None or not direct.any() else out.filter(
        pa.array(~direct | (cols["kind"] == Kind.CANCEL.value)))   # a cancel: the wheel's too


def _positions(numbers: dict[str, np.ndarray]) -> str:
    """The batch's records as partition:first-last offsets."""
    return ", ".join(f"{p}:{numbers['ioff'][numbers['ipart'] == p].min()}-"
                     f"{numbers['ioff'][numbers['ipart'] == p].max()}"
                     for p in np.unique(numbers["ipart"]))


def _envelopes(batch: pa.RecordBatch, cols: dict[str, np.ndarray], user: np.ndarray,
               row_of: np.ndarray, names: pa.Array, values: pa.Array) -> pa.RecordBatch:
    """The ENVELOPE columns decided, with the batch's positions; with its body (key, value
    and the `user` headers), ENVELOPE, else INDEX_ENVELOPE."""
    arrays = {
        **{name: pa.array(cols[name], ENVELOPE.field(name).type) for name in cols},
        "append_ms": batch.column("append_ms").cast(pa.int64()),
        "ipart": batch.column("ipart").cast(pa.int32()),
        "ioff": batch.column("ioff").cast(pa.int64()),
    }
    schema = INDEX_ENVELOPE
    if "value" in batch.schema.names:
        hkeys, hvals = _user_headers(user, row_of, batch.num_rows, names, values)
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


def make_parser(rules: Rules, slot_ms: int, spread: int, window_ms: int,
                overdue_before_ms: int = 0):
    """The function handed to mapInArrow: the wheel's parse, leaving out what the dispatch tasks
    take within `window_ms` (-1: none) and the ring's horizon."""

    def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        for batch in batches:
            yield parse_batch(batch, rules, slot_ms, spread, int(time.time() * 1000),
                              overdue_before_ms, window_ms=window_ms)
    return parse_batches
