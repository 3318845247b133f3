"""The last stage before the sink: hold each message until its due time, then let it go.

The wheel fires groups ahead of time (the watermark lags the clock); this stage is what makes
"never early" true: a row leaves only when the clock has reached its due_ms. Rows stream out
in due order, in small chunks, so the Kafka writer sends each one close to its due time.

It works on Arrow record batches (Spark's mapInArrow): the rows carry the messages' payloads
and headers, and a pandas round trip would convert every header to a Python dict and back.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc


def by_due(batches: Iterator[pa.RecordBatch]) -> pa.Table | None:
    """All of `batches`' rows in one table, in due order; None if there are none. Rows that
    come in due order already (a burst due at one moment) are not copied: the sort's `take`
    copies every payload, and on a task's 250,000 rows of 1 KiB it took 2.6 s of a burst's
    hold stage, between the last row read and the first sent (docs/benchmarks.md)."""
    parts = [batch for batch in batches if batch.num_rows]
    if not parts:
        return None
    rows = pa.Table.from_batches(parts)
    due = rows.column("due_ms").to_numpy()
    if (due[1:] >= due[:-1]).all():
        return rows
    return rows.take(pc.sort_indices(rows, [("due_ms", "ascending")]))


def hold_until_due(batches: Iterator[pa.RecordBatch], clock: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep,
                   flush: Callable[[], None] = lambda: None) -> Iterator[pa.Table]:
    """Yield `batches`' rows in due order, each chunk once the clock reaches its due time.
    Before each wait it calls `flush`: whatever was released so far must leave now, not sit
    in an output buffer until the rows after it are due."""
    rows = by_due(batches)
    if rows is None:
        return
    due = rows.column("due_ms").to_numpy()
    start = 0
    while start < len(due):
        now_ms = int(clock() * 1000)
        if due[start] > now_ms:
            if start:
                flush()
            sleep((int(due[start]) - now_ms) / 1000.0)
            continue
        end = int(due.searchsorted(now_ms, side="right"))
        yield rows.slice(start, end - start)
        start = end
