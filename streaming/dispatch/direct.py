"""The dispatch tasks' own read of the intake (DESIGN.md section 4, "Short delays").

A message whose level's delay is at most `dispatch_direct_max_delay_ms` (an immediate one too)
would fire in the wheel batch that reads it, so the wheel's micro-batches would set its
lateness. Instead, ready partition p's dispatch task also reads the intake partitions q with
q mod (ready partitions) = p, parses them by the wheel's rules (state/parse.py marks them
Kind.DIRECT) and holds them like fired rows. Which records are the dispatch's is a rule of the
headers alone (`is_direct`), which the wheel applies in the JVM before its parse
(streaming/wheel/query.py `direct_column`), so the short levels' payloads never reach the
wheel's Python. One intake partition has one sender, so a key's messages keep their intake
order. No Spark import: it runs in the dispatch task's Python worker.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from streaming.dispatch.rules import Row
from state import headers as H
from state.columns import HEADERS
from state.envelope import Kind, Rules
from state.parse import parse_batch

# Headers that keep a record with the wheel whatever its DELAY says: timers, cancels, the
# job's heartbeat and messages rolled back from the cold tier.
WHEEL_HEADERS = frozenset((*H.TIMER_HEADERS, H.TIMER_DEL_UNIQKEY, H.HEARTBEAT, H.ROLLED))


def direct_values(rules: Rules, direct_max_delay_ms: int) -> frozenset[bytes]:
    """The DELAY values, as producers write them ("0", "1", …), of the levels whose delay is
    at most `direct_max_delay_ms`; none when it is negative."""
    if direct_max_delay_ms < 0:
        return frozenset()
    return frozenset(str(level).encode() for level, delay in
                     enumerate((0, *rules.level_delays_ms)) if delay <= direct_max_delay_ms)


def is_direct(headers: list | None, values: frozenset[bytes]) -> bool:
    """Whether a dispatch task sends this intake record itself: short-level values on (one
    or more — twice is a dead letter) DELAY headers, or none at all (an immediate message),
    and no header of WHEEL_HEADERS. Such a record parses as Kind.DIRECT or Kind.DEAD."""
    if not values:
        return False
    for name, value in headers or ():
        if name in WHEEL_HEADERS or (name == H.DELAY and value not in values):
            return False
    return True


def intake_batch(msgs: list, each: list | None = None) -> pa.RecordBatch:
    """Consumed intake records in the layout the wheel's parse reads (streaming/wheel/query.py
    intake_stream): key, value, ipart, ioff, append_ms (the broker's LogAppendTime), headers
    (`each`: the records' headers, when read already; the client builds them at every call)."""
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
    """The records of `msgs` a dispatch task sends itself (`is_direct`): the good ones as rows
    to hold (their headers as the wheel delivers them: the message's own, then UNIQ_KEY and
    DELIVER_MS) and the bad ones as (row, reason) to dead-letter (their headers as they came);
    and the (partition, offset) of every other record, which the wheel takes care of."""
    values = direct_values(rules, direct_max_delay_ms)
    each = [m.headers() or () for m in msgs]
    mine = [is_direct(headers, values) for headers in each]
    others = [(m.partition(), m.offset()) for m, d in zip(msgs, mine) if not d]
    if len(others) == len(msgs):
        return [], [], others
    batch = intake_batch([m for m, d in zip(msgs, mine) if d],
                         [headers for headers, d in zip(each, mine) if d])
    parsed = parse_batch(batch, rules, slot_ms=1000, spread=1, now_ms=now_ms,
                         direct_max_delay_ms=direct_max_delay_ms)
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
