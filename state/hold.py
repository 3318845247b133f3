"""The last stage before the sink: hold each message until its due time, then let it go.

The wheel fires groups ahead of time (the watermark lags the clock); this stage is what makes
"never early" true: a row leaves only when the clock has reached its due_ms. Rows stream out
in due order, in small chunks, so the Kafka writer sends each one close to its due time.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import pandas as pd


def hold_until_due(frames: Iterator[pd.DataFrame], clock: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[pd.DataFrame]:
    parts = [frame for frame in frames if len(frame)]
    if not parts:
        return
    rows = pd.concat(parts, ignore_index=True).sort_values("due_ms", kind="stable")
    due = rows["due_ms"].to_numpy()
    start = 0
    while start < len(rows):
        now_ms = int(clock() * 1000)
        if due[start] > now_ms:
            sleep((int(due[start]) - now_ms) / 1000.0)
            continue
        end = int(due.searchsorted(now_ms, side="right"))
        yield rows.iloc[start:end]
        start = end
