"""The wheel's state under Spark 4's transformWithStateInPandas: the turn of the wheel
(state/wheel.py) with a group's state kept as a list of chunks.

Why this operator: applyInPandasWithState hands a group's whole state to Python and back on
every batch that adds to it, and scans every group's state for expired timeouts each batch.
Here a batch that only adds to a group appends its chunks as list elements, the count and
earliest due time live in a small value of their own, and the timers are an index Spark reads
by time. On the local standalone cluster, 500,000 timers due together were delivered with p99
30 s (250,180 within 10 s) against 67 s (none within 10 s) with applyInPandasWithState, whose
executors ran out of heap unless the burst was split into 64 groups (`delayq bench --scenarios
cluster`, the same hour).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pyspark.sql.streaming.stateful_processor import (ExpiredTimerInfo, StatefulProcessor,
                                                      StatefulProcessorHandle, TimerValues)
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from state.groups import WheelConfig
from state.worker import settle

if TYPE_CHECKING:
    import pandas as pd

# A group's state: its chunks (state/wheel.py encode), and its count, earliest due time and the
# one event-time timer it has registered.
CHUNKS = StructType([StructField("chunk", StringType(), False)])
META = StructType([StructField("count", IntegerType(), False),
                   StructField("earliest_ms", LongType(), False),
                   StructField("timer_ms", LongType(), False)])


class Held:
    """A group's state for one call, as the wheel (`turn`) sees it: whether it holds messages,
    their count and earliest due time, their chunks, the watermark, and `keep` (new chunks
    appended or all replaced, count, earliest, timer) or `remove`."""

    def __init__(self, handle: StatefulProcessorHandle, chunks, meta, timer_values: TimerValues,
                 expired_ms: int | None = None):
        self._handle, self._chunks, self._meta = handle, chunks, meta
        self.watermark_ms = timer_values.getCurrentWatermarkInMs()
        got = meta.get()
        self.exists = got is not None
        self._got = tuple(int(v) for v in got) if got is not None else None
        # The timer that expired for this call is gone already: Spark removed it.
        self._timer = None if got is None or self._got[2] == expired_ms else self._got[2]

    def meta(self) -> tuple[int, int]:
        return self._got[0], self._got[1]

    def chunks(self) -> list[str]:
        return [row[0] for row in self._chunks.get()]

    def keep(self, count, earliest, timer_ms, chunks, append) -> None:
        # A chunk a call: Spark's state server reads each call's message whole into the
        # executor's heap, so a call of many chunks would cost what one large chunk did.
        if chunks and not append:
            self._chunks.put([(chunks[0],)])
        for chunk in chunks[0 if append else 1:]:
            self._chunks.appendValue((chunk,))
        if timer_ms != self._timer:
            if self._timer is not None:
                self._handle.deleteTimer(self._timer)
            self._handle.registerTimer(timer_ms)
        if (count, earliest, timer_ms) != self._got:
            self._meta.update((count, earliest, timer_ms))

    def remove(self) -> None:
        if self._timer is not None:
            self._handle.deleteTimer(self._timer)
        self._chunks.clear()
        self._meta.clear()


class WheelProcessor(StatefulProcessor):
    """The stateful processor handed to transformWithStateInPandas."""

    def __init__(self, config: WheelConfig):
        self._config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        self._chunks = handle.getListState("chunks", CHUNKS)
        self._meta = handle.getValueState("meta", META)

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        from state.wheel import incoming, turn   # imported here: see state/groups.py

        settle()
        frame = incoming(rows)
        held = Held(self._handle, self._chunks, self._meta, timerValues)
        yield from turn(int(key[0]), frame, held, self._config)

    def handleExpiredTimer(self, key, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        from state.wheel import turn

        settle()
        held = Held(self._handle, self._chunks, self._meta, timerValues,
                    expired_ms=expiredTimerInfo.getExpiryTimeInMs())
        yield from turn(int(key[0]), None, held, self._config)
