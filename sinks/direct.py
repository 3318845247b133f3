"""The dispatch tasks' own read of the intake (DESIGN.md section 4, "Short delays").

A message whose level's delay is at most `dispatch_direct_max_delay_ms` (an immediate one too)
would fire in the wheel batch that reads it, so the wheel's micro-batches would set its
lateness. Instead, ready partition p's dispatch task also reads the intake partitions q with
q mod (ready partitions) = p, parses them by the wheel's own rules (state/parse.py marks those
messages Kind.DIRECT, a rule of the row alone) and holds them like fired rows; the wheel counts
them and leaves them out. One intake partition has one sender, so a key's messages keep their
intake order. No Spark import: it runs in the dispatch task's Python worker.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from sinks.dispatch import Row
from state import headers as H
from state.envelope import Kind, Rules
from state.parse import parse_batch

_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def owned(intake_partitions: int, ready_partitions: int, task: int) -> list[int]:
    """The intake partitions ready partition `task`'s dispatch task reads."""
    return [q for q in range(intake_partitions) if q % ready_partitions == task]


def intake_batch(msgs: list) -> pa.RecordBatch:
    """Consumed intake records in the layout the wheel's parse reads (streaming/wheel_query.py
    intake_stream): key, value, ipart, ioff, append_ms (the broker's LogAppendTime), headers."""
    headers = [[{"key": k, "value": v} for k, v in (m.headers() or [])] for m in msgs]
    return pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([m.partition() for m in msgs], pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([m.timestamp()[1] for m in msgs], pa.int64()),
        pa.array(headers, _HEADERS),
    ], names=["key", "value", "ipart", "ioff", "append_ms", "headers"])


def direct_rows(msgs: list, rules: Rules, direct_max_delay_ms: int, now_ms: int,
                topic: str) -> tuple[list[Row], list[tuple[int, int]]]:
    """The Kind.DIRECT messages among `msgs` as rows to hold (their headers as the wheel
    delivers them: the message's own, then UNIQ_KEY and DELIVER_MS), and the (partition,
    offset) of every other record, which the wheel takes care of."""
    parsed = parse_batch(intake_batch(msgs), rules, slot_ms=1000, spread=1, now_ms=now_ms,
                         direct_max_delay_ms=direct_max_delay_ms)
    direct = np.asarray(parsed.column("kind").to_numpy(zero_copy_only=False)) == Kind.DIRECT.value
    others = [(m.partition(), m.offset()) for m, d in zip(msgs, direct) if not d]
    if not direct.any():
        return [], others
    cols = parsed.filter(pa.array(direct)).to_pydict()
    rows = []
    for i, (due, uniq) in enumerate(zip(cols["due_ms"], cols["uniq_key"])):
        own = list(zip(cols["hkeys"][i] or [], cols["hvals"][i] or []))
        headers = own + [(H.UNIQ_KEY, uniq.encode()), (H.DELIVER_MS, str(due).encode())]
        rows.append(Row(due, cols["ipart"][i], cols["ioff"][i], cols["ioff"][i],
                        cols["topic"][i], cols["qid"][i], cols["key"][i], cols["value"][i],
                        headers, cols["level"][i], cols["append_ms"][i], uniq,
                        source=(topic, cols["ipart"][i])))
    return rows, others

