"""The wheel (`turn`), run by applyInPandasWithState with event-time timeouts (`make_wheel`): a
group (bucket, slot) holds an index of its pending messages, never their bodies, as RocketMQ's
schedule queue does, and releases those due by the fire horizon to the ready topic."""
from __future__ import annotations

import json
from typing import Callable, Generator, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from state.columns import REFERENCE, WHEEL_OUT
from state.envelope import Kind
from state.groups import (BUCKET_COLD, BUCKET_DEAD, BUCKET_NOW, BUCKET_TIMER,  # noqa: F401
                          WheelConfig, part_of)
from state.placement import balanced_slot, spread_slots
from state.timing import timer_for
from state.worker import settle

# Pass-through buckets keep no state. Heartbeats ride with immediate messages and are dropped in
# the wheel: a filter before it would be pushed below withWatermark, which would never see them.
_PASS_THROUGH = {Kind.DEAD: BUCKET_DEAD, Kind.COLD: BUCKET_COLD, Kind.NOW: BUCKET_NOW,
                 Kind.HEARTBEAT: BUCKET_NOW}


def group_of(kind: str, level: int, due_ms: int, ioff: int, slot_ms: int, spread: int,
             uniq_key: str = "", *, timer_parts: int) -> tuple[int, int]:
    """(bucket, slot) for an envelope: its wheel group (a level's due slot; a timer's from
    `timer_slots`, a cancel's by the UNIQ_KEY it cancels), or for a pass-through row, by intake
    offset, one of `spread` groups on `spread` different state partitions (state/placement.py)."""
    passing = _PASS_THROUGH.get(kind)
    if passing is not None:
        return passing, spread_slots(passing, spread)[ioff % spread]
    if level == BUCKET_TIMER:
        return level, int(timer_slots(np.array([due_ms], np.int64), np.array([uniq_key]),
                                      slot_ms, spread, timer_parts)[0])
    return level, due_ms // slot_ms   # slots are `slot_ms` wide, aligned to the epoch


def timer_slots(due_ms: np.ndarray, uniq_keys: np.ndarray, slot_ms: int, spread: int,
                parts: int) -> np.ndarray:
    """Timers' wheel-group slot numbers: a due slot's `parts` parts by UNIQ_KEY, each numbered by
    `balanced_slot` so the parts take the state partitions in turn (both parse paths use it)."""
    groups = (due_ms // slot_ms) * parts + np.fromiter(
        (part_of(k, parts) for k in uniq_keys), np.int64, len(uniq_keys))
    distinct, back = np.unique(groups, return_inverse=True)
    return np.array([balanced_slot(BUCKET_TIMER, int(g), spread) for g in distinct],
                    dtype=np.int64)[back]


def real_watermark(spark_watermark_ms: int, config: WheelConfig) -> int:
    """The wheel's watermark in real time: Spark's plus the delay Spark subtracted, or, in a
    new query's first batch (Spark's is still 0), the query's start."""
    if spark_watermark_ms <= 0 and config.first_watermark_ms:
        return config.first_watermark_ms
    return spark_watermark_ms + config.watermark_delay_ms


class Held:
    """A group's GroupState as `turn` sees it: one row (state/columns.py STATE) holding its
    references, read and written whole, and its one event-time timeout."""

    def __init__(self, state):
        self._state = state
        self.exists = state.exists
        self.watermark_ms = state.getCurrentWatermarkMs()

    def index(self) -> pa.Table:
        """The references the group holds (empty when none)."""
        if not self.exists:
            return REFERENCE.empty_table()
        lists = json.loads(self._state.get[2])
        return pa.table([pa.array(lists[field.name], field.type) for field in REFERENCE],
                        schema=REFERENCE)

    def keep(self, index: pa.Table, earliest_ms: int, timer_ms: int) -> None:
        """Hold `index` and time out at `timer_ms` (Spark clears a timeout once it fired, so
        every call that keeps state sets one)."""
        refs = json.dumps({name: index.column(name).to_pylist() for name in REFERENCE.names},
                          separators=(",", ":"))
        self._state.update((index.num_rows, earliest_ms, refs))
        self._state.setTimeoutTimestamp(timer_ms)

    def remove(self) -> None:
        self._state.remove()


def _rows(n: int, **columns) -> pd.DataFrame:
    """A WHEEL_OUT frame of n rows; unnamed columns are object arrays of None: pandas turns a
    scalar None into NaN, which Spark cannot convert to a list or string column."""
    return pd.DataFrame({
        name: (np.empty(n, dtype=object) if name not in columns
               else columns[name].values if isinstance(columns[name], pd.Series)
               else columns[name])
        for name in WHEEL_OUT.names}, index=pd.RangeIndex(n))


def _reference(rows: pd.DataFrame) -> dict:
    """The columns that name a message's intake record, and its UNIQ_KEY."""
    return {name: rows[name] for name in ("uniq_key", "append_ms", "ipart", "ioff")}


def _deliveries(pending: pd.DataFrame, level: int | pd.Series) -> pd.DataFrame:
    """References ready for the dispatch at their due time as the parse set it: the wheel decides
    on the watermark (the broker's clock), so no host clock corrects it (state/timing.py)."""
    n = len(pending)
    levels = level if isinstance(level, pd.Series) else np.full(n, level, dtype=np.int64)
    return _rows(n, kind="deliver", due_ms=pending["due_ms"], level=levels,
                 **_reference(pending))


def _tally(levels: dict[int, tuple[int, int]]) -> pd.DataFrame:
    """One row per level: (received, pending_delta); every other column null."""
    return _rows(len(levels), kind="tally", level=list(levels),
                 received=[r for r, _ in levels.values()],
                 pending_delta=[d for _, d in levels.values()])


def _timer(earliest: int, count: int, bucket: int, watermark: int, config: WheelConfig) -> int:
    """The group's event-time timer, in Spark's watermark units (real time minus its delay)."""
    return (timer_for(earliest, config.lead_for(count, bucket), watermark)
            - config.watermark_delay_ms)


def _pass_through(bucket: int, rows: pd.DataFrame, config: WheelConfig) -> Iterator[pd.DataFrame]:
    """A pass-through group's rows (no state): counted by level, then sent on."""
    taken = rows[(rows["kind"] != Kind.HEARTBEAT) & ~rows["rolled"].astype(bool)]
    if len(taken):
        counts = taken.groupby("level")["kind"].count()
        colds = taken[taken["kind"] == Kind.COLD].groupby("level")["kind"].count()
        yield _tally({int(lv): (int(n), int(colds.get(lv, 0))) for lv, n in counts.items()})
    if bucket == BUCKET_COLD:   # the job reads its body back and parks it (sinks/cold.py)
        cold = rows[rows["kind"] == Kind.COLD]
        yield _rows(len(cold), kind="cold", due_ms=cold["due_ms"], level=cold["level"],
                    topic=cold["topic"], partition=cold["qid"], **_reference(cold))
        return
    dead = rows[rows["kind"] == Kind.DEAD]
    if len(dead):   # the job reads its record back and adds DLQ_REASON from `reason`
        yield _rows(len(dead), kind="dead", due_ms=0, reason=dead["reason"], level=dead["level"],
                    topic=config.dlq_topic, **_reference(dead))
    ready = rows[rows["kind"] == Kind.NOW]
    if len(ready):
        yield _deliveries(ready, ready["level"])


def _arrivals(held_rows: pa.Table, new: pd.DataFrame) -> tuple[pa.Table, pd.DataFrame, int, int]:
    """A group's new messages beside those it holds: (held, new, received, rolled). A roll retried
    after a crash is held once; rolled messages were received already, so count as rolled, not
    received (and as pending still, but for timers: the roll counted them out, sinks/cold.py).
    Only rolled ones are checked: a producer's resend is its own message, sent again."""
    rolled = new["rolled"].astype(bool).to_numpy()
    received = len(new) - int(rolled.sum())
    if rolled.any():
        keys = new["uniq_key"]
        again = rolled & (keys.duplicated(keep="first").to_numpy() | keys.isin(
            held_rows.column("uniq_key").to_pylist()).to_numpy())
        new = new[~again]
    return held_rows, new, received, int(new["rolled"].astype(bool).sum())


def _cancel(cancels: pd.DataFrame, held_rows: pa.Table,
            new: pd.DataFrame) -> Generator[pd.DataFrame, None, tuple]:
    """Drop the messages the group's cancels name, held or arriving in this batch; yields the
    cancels' outcomes and returns (held, new)."""
    targets = sorted(set(cancels["cancel_key"]))
    hit = pc.is_in(held_rows.column("uniq_key"), value_set=pa.array(targets, pa.string()))
    found = set(held_rows.filter(hit).column("uniq_key").to_pylist())
    held_rows = held_rows.filter(pc.invert(hit))
    if len(new):
        gone = new["uniq_key"].isin(targets).to_numpy()
        found.update(new["uniq_key"][gone])
        new = new[~gone]
    outcome = ["cancelled" if k in found else "cancel_unknown" for k in cancels["cancel_key"]]
    yield _rows(len(cancels), kind=outcome, uniq_key=cancels["cancel_key"], level=cancels["level"],
                due_ms=cancels["due_ms"], append_ms=cancels["append_ms"], ipart=cancels["ipart"],
                ioff=cancels["ioff"])
    return held_rows, new


def turn(bucket: int, rows: pd.DataFrame | None, held: Held,
         config: WheelConfig) -> Iterator[pd.DataFrame]:
    """One call of the wheel for one group: its new rows (None: its timeout fired) and its
    held state. Yields the output frames and leaves the state and its timeout set."""
    if bucket in (BUCKET_NOW, BUCKET_DEAD, BUCKET_COLD):
        if rows is not None:
            yield from _pass_through(bucket, rows, config)
        return
    held_rows = held.index()
    before = held_rows.num_rows
    received = rolled = 0
    new = None
    if rows is not None:
        new = rows[rows["kind"] == Kind.DELAY]
        if len(new):
            held_rows, new, received, rolled = _arrivals(held_rows, new)
        cancels = rows[rows["kind"] == Kind.CANCEL]
        if len(cancels):
            held_rows, new = yield from _cancel(cancels, held_rows, new)
    arriving = len(new) if new is not None else 0
    watermark = real_watermark(held.watermark_ms, config)
    # Due by the horizon: released now, the lead ahead of the watermark (which trails the clock)
    # so they reach their dispatch task before due. One horizon for every group, not the clock,
    # keeps a level in due order.
    horizon = watermark + config.lead_for(held_rows.num_rows + arriving, bucket)
    fired, rest = _due(held_rows, new if arriving else None, horizon)
    if fired:
        yield _deliveries(fired[0] if len(fired) == 1 else pd.concat(fired, ignore_index=True),
                          bucket)
    if received or rolled or rest.num_rows != before:
        pending = rest.num_rows - before - (rolled if bucket != BUCKET_TIMER else 0)
        yield _tally({bucket: (received, pending)})
    if rest.num_rows:
        earliest = pc.min(rest.column("due_ms")).as_py()
        held.keep(rest, earliest, _timer(earliest, rest.num_rows, bucket, watermark, config))
    elif held.exists:
        held.remove()


def _due(held_rows: pa.Table, new: pd.DataFrame | None,
         horizon: int) -> tuple[list[pd.DataFrame], pa.Table]:
    """The references due by `horizon` (held and new) and the rest. Held ones stay in Arrow (only
    those that fire are converted); new ones that fire at once go out as they came."""
    due = pc.less_equal(held_rows.column("due_ms"), horizon)
    fired = [held_rows.filter(due).to_pandas()] if held_rows.num_rows else []
    rest = held_rows.filter(pc.invert(due))
    if new is not None:
        now = new["due_ms"].to_numpy() <= horizon
        new = new[REFERENCE.names]
        some, every = now.any(), now.all()
        if some:
            fired.append(new if every else new[now])
        if not every:
            later = pa.Table.from_pandas(new[~now] if some else new, schema=REFERENCE,
                                         preserve_index=False)
            rest = pa.concat_tables([rest, later]) if rest.num_rows else later
    return [frame for frame in fired if len(frame)], rest


def make_wheel(config: WheelConfig) -> Callable:
    """The function handed to applyInPandasWithState, closed over its configuration."""

    def wheel(key: tuple, frames: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        settle()
        new = [frame for frame in frames if len(frame)]   # the group's rows of this batch
        rows = pd.concat(new, ignore_index=True) if new else None
        yield from turn(int(key[0]), rows, Held(state), config)
    return wheel
