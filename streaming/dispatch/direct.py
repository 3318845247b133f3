"""The dispatch tasks' own read of the intake (DESIGN.md section 4, the direct window): a message
due within `dispatch_direct_max_delay_ms` of its append (a short level, a short or just-past
timer, a cancel of a message due that soon) would wait for a wheel micro-batch, so ready partition
p's task reads intake partitions q with q mod (ready partitions) = p and holds their rows itself.
`is_direct` looks at the record alone (headers, append time, position), never at a clock, so the
wheel applies the same rule in the JVM (streaming/wheel/query.py `direct_column`). One sender per
intake partition keeps a key's order. No Spark import."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from streaming.dispatch.rules import Row
from state import headers as H
from state.columns import HEADERS
from state.envelope import Kind, Rules
from state.parse import parse_batch
from state.split import is_direct

def intake_batch(msgs: list, each: list | None = None) -> pa.RecordBatch:
    """Consumed intake records in the layout the wheel's parse reads (streaming/wheel/query.py
    intake_stream); `each`: their headers if read already (the client builds them per call)."""
    if each is None:
        each = [m.headers() or () for m in msgs]
    flat = [header for headers in each for header in headers]
    names, values = zip(*flat) if flat else ((), ())
    ends = np.zeros(len(msgs) + 1, np.int32)   # built flat: no Python dict per header
    np.cumsum([len(headers) for headers in each], out=ends[1:])
    return pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([m.partition() for m in msgs], pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([m.timestamp()[1] for m in msgs], pa.int64()),
        pa.ListArray.from_arrays(pa.array(ends), pa.StructArray.from_arrays(
            [pa.array(names, pa.string()), pa.array(values, pa.binary())],
            fields=list(HEADERS.value_type)), type=HEADERS),
    ], names=["key", "value", "ipart", "ioff", "append_ms", "headers"])


def direct_rows(msgs: list, rules: Rules, direct_max_delay_ms: int, now_ms: int, topic: str
                ) -> tuple[list[Row], list[tuple[Row, str]], list[Row], list[tuple[int, int]]]:
    """The records of `msgs` a task takes itself: rows to hold (headers as the wheel delivers
    them), (row, reason) to dead-letter (headers as they came), cancels (a row naming its
    target: UNIQ_KEY, level and due time); and the (partition, offset) of every other record,
    the wheel's."""
    each = [m.headers() or () for m in msgs]
    mine = [is_direct(headers, m.timestamp()[1], m.partition(), m.offset(), rules,
                      direct_max_delay_ms) for m, headers in zip(msgs, each)]
    others = [(m.partition(), m.offset()) for m, d in zip(msgs, mine) if not d]
    if len(others) == len(msgs):
        return [], [], [], others
    batch = intake_batch([m for m, d in zip(msgs, mine) if d],
                         [headers for headers, d in zip(each, mine) if d])
    parsed = parse_batch(batch, rules, slot_ms=1000, spread=1, now_ms=now_ms)
    cols = parsed.to_pydict()
    rows, dead, cancels = [], [], []
    for i, (kind, due, uniq) in enumerate(zip(cols["kind"], cols["due_ms"], cols["uniq_key"])):
        own = list(zip(cols["hkeys"][i] or [], cols["hvals"][i] or []))
        part, off, append = cols["ipart"][i], cols["ioff"][i], cols["append_ms"][i]
        if kind == Kind.DEAD.value:
            dead.append((Row(append, part, off, off, None, None, cols["key"][i], cols["value"][i],
                             own, 0, append, uniq, source=(topic, part)), cols["reason"][i]))
        elif kind == Kind.CANCEL.value:
            cancels.append(Row(due, part, off, off, None, None, None, None, [], cols["level"][i],
                               append, cols["cancel_key"][i], source=(topic, part)))
        else:
            headers = own + [(H.UNIQ_KEY, uniq.encode()), (H.DELIVER_MS, str(due).encode())]
            rows.append(Row(due, part, off, off, cols["topic"][i], cols["qid"][i],
                            cols["key"][i], cols["value"][i], headers, cols["level"][i], append,
                            uniq, source=(topic, part)))
            rows[-1].rolled = bool(cols["rolled"][i])
    return rows, dead, cancels, others
