"""The parse stage over one Arrow batch of intake records: envelopes and wheel groups.

Arrow in, Arrow out (Spark's mapInArrow): the key and value columns pass through untouched,
the headers are read once as flat name and value lists, and the user headers are cut out of
them with array operations. Only the per-record rules (`state.envelope`) run per row.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state import headers as H
from state.columns import ENVELOPE
from state.envelope import Kind, Rules, parse
from state.wheel import group_of
from state.worker import settle

_CONTROL = pa.array(sorted(H.CONTROL_HEADERS), pa.string())


def _flat_headers(headers: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Per-row header counts, and all rows' header names and values, flat (null rows: none)."""
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    names, values = headers.flatten().flatten()
    return counts.astype(np.int64), names, values


def parse_batch(batch: pa.RecordBatch, rules: Rules, slot_ms: int, spread: int,
                now_ms: int, overdue_before_ms: int = 0) -> pa.RecordBatch:
    """Intake columns (key, value, ipart, ioff, append_ms, headers) → ENVELOPE columns.

    A level message due before `overdue_before_ms` (the moment the checkpoint's query first
    started) is overdue on arrival: it goes out with the immediate messages, spread over the
    pass-through groups, instead of into its level's wheel group. Since that held from the
    checkpoint's first batch, no such message is ever in the state, so a level still leaves in
    due order: the ones due before that moment in intake order (which, for a level, is due
    order), every held one after them. A job started on a backlog (a first deployment, or a
    checkpoint started over) then sends it as it reads it, instead of storing each batch and
    firing it in the next, and the wheel's stage is no longer as uneven as a level's few slots
    hash over the state partitions. Timers (a cancel names their group) and messages rolled in
    from the cold tier keep to the wheel."""
    n = batch.num_rows
    counts, names, values = _flat_headers(batch.column("headers"))
    starts = np.concatenate(([0], np.cumsum(counts)))
    name_list, value_list = names.to_pylist(), values.to_pylist()
    ipart = batch.column("ipart").to_pylist()
    ioff = batch.column("ioff").to_pylist()
    append = batch.column("append_ms").to_pylist()

    cols: dict[str, list] = {name: [None] * n for name in
                             ("kind", "bucket", "slot", "level", "due_ms", "uniq_key", "topic",
                              "qid", "reason", "cancel_key", "rolled")}
    dead = np.zeros(n, dtype=bool)
    for i in range(n):
        a, b = starts[i], starts[i + 1]
        env = parse(list(zip(name_list[a:b], value_list[a:b])), ipart[i], ioff[i], append[i],
                    rules, now_ms)
        kind = env.kind
        if kind == Kind.DELAY and env.level > 0 and not env.rolled \
                and env.due_ms < overdue_before_ms:
            kind = Kind.NOW
        cols["bucket"][i], cols["slot"][i] = group_of(
            kind, env.level, env.due_ms, ipart[i], ioff[i], slot_ms, spread,
            env.cancel_key if kind == Kind.CANCEL else env.uniq_key)
        cols["kind"][i] = kind.value
        cols["level"][i] = env.level
        cols["due_ms"][i] = env.due_ms
        cols["uniq_key"][i] = env.uniq_key
        cols["topic"][i] = env.real_topic
        cols["qid"][i] = env.real_qid
        cols["reason"][i] = env.reason
        cols["cancel_key"][i] = env.cancel_key
        cols["rolled"][i] = env.rolled
        dead[i] = env.kind == Kind.DEAD

    # User headers: every header but the contract's control headers, in order; a dead letter
    # keeps all of its original headers.
    row_of = np.repeat(np.arange(n), counts)
    keep = ~pc.is_in(names, value_set=_CONTROL).to_numpy(zero_copy_only=False) | dead[row_of]
    offsets = pa.array(np.concatenate(([0], np.cumsum(np.bincount(row_of[keep], minlength=n)))),
                       pa.int32())
    mask = pa.array(keep)
    hkeys = pa.ListArray.from_arrays(offsets, names.filter(mask))
    hvals = pa.ListArray.from_arrays(offsets, values.filter(mask))

    arrays = {
        **{name: pa.array(cols[name], ENVELOPE.field(name).type) for name in cols},
        "key": batch.column("key").cast(pa.binary()),
        "value": batch.column("value").cast(pa.binary()),
        "hkeys": hkeys, "hvals": hvals,
        "append_ms": batch.column("append_ms").cast(pa.int64()),
        "ipart": batch.column("ipart").cast(pa.int32()),
        "ioff": batch.column("ioff").cast(pa.int64()),
    }
    return pa.RecordBatch.from_arrays([arrays[name] for name in ENVELOPE.names], schema=ENVELOPE)


def make_parser(rules: Rules, slot_ms: int, spread: int,
                clock: Callable[[], float] = time.time, overdue_before_ms: int = 0):
    """The function handed to mapInArrow."""

    def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        for batch in batches:
            yield parse_batch(batch, rules, slot_ms, spread, int(clock() * 1000),
                              overdue_before_ms)

    return parse_batches
