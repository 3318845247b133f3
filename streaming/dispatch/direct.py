"""The dispatch tasks' own read of the intake (DESIGN.md section 4, "Short delays"): a level
of at most `dispatch_direct_max_delay_ms` would wait for a wheel micro-batch, so ready partition
p's task reads intake partitions q with q mod (ready partitions) = p and holds their rows itself.
`is_direct` looks at headers alone, so the wheel applies it in the JVM (streaming/wheel/query.py
`direct_column`). One sender per intake partition keeps a key's order. No Spark import."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from streaming.dispatch.rules import Row
from state import headers as H
from state.columns import HEADERS
from state.envelope import Kind, Rules
from state.parse import parse_batch

# Headers that keep a record with the wheel whatever its DELAY says.
WHEEL_HEADERS = frozenset((*H.TIMER_HEADERS, H.TIMER_DEL_UNIQKEY, H.HEARTBEAT, H.ROLLED))


def direct_values(rules: Rules, direct_max_delay_ms: int) -> frozenset[bytes]:
    """The DELAY values ("0", "1", …) of the levels whose delay is at most
    `direct_max_delay_ms`; none when it is negative."""
    if direct_max_delay_ms < 0:
        return frozenset()
    return frozenset(str(level).encode() for level, delay in
                     enumerate((0, *rules.level_delays_ms)) if delay <= direct_max_delay_ms)


def is_direct(headers: list | None, values: frozenset[bytes]) -> bool:
    """Whether a dispatch task sends this intake record itself: only short-level DELAY values
    (several: a dead letter; none: immediate), no WHEEL_HEADERS. Parses as NOW, DELAY or DEAD."""
    if not values:
        return False
    for name, value in headers or ():
        if name in WHEEL_HEADERS or (name == H.DELAY and value not in values):
            return False
    return True


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
                ) -> tuple[list[Row], list[tuple[Row, str]], list[tuple[int, int]]]:
    """The records of `msgs` a task sends itself: rows to hold (headers as the wheel delivers
    them), (row, reason) to dead-letter (headers as they came); and the (partition, offset) of
    every other record, the wheel's."""
    values = direct_values(rules, direct_max_delay_ms)
    each = [m.headers() or () for m in msgs]
    mine = [is_direct(headers, values) for headers in each]
    others = [(m.partition(), m.offset()) for m, d in zip(msgs, mine) if not d]
    if len(others) == len(msgs):
        return [], [], others
    batch = intake_batch([m for m, d in zip(msgs, mine) if d],
                         [headers for headers, d in zip(each, mine) if d])
    parsed = parse_batch(batch, rules, slot_ms=1000, spread=1, now_ms=now_ms)
    cols = parsed.to_pydict()
    rows, dead = [], []
    for i, (kind, due, uniq) in enumerate(zip(cols["kind"], cols["due_ms"], cols["uniq_key"])):
        own = list(zip(cols["hkeys"][i] or [], cols["hvals"][i] or []))
        part, off, append = cols["ipart"][i], cols["ioff"][i], cols["append_ms"][i]
        if kind == Kind.DEAD.value:
            dead.append((Row(append, part, off, off, None, None, cols["key"][i], cols["value"][i],
                             own, 0, append, uniq, source=(topic, part)), cols["reason"][i]))
            continue
        headers = own + [(H.UNIQ_KEY, uniq.encode()), (H.DELIVER_MS, str(due).encode())]
        rows.append(Row(due, part, off, off, cols["topic"][i], cols["qid"][i], cols["key"][i],
                        cols["value"][i], headers, cols["level"][i], append, uniq,
                        source=(topic, part)))
    return rows, dead, others
