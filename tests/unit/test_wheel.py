"""The wheel (state/wheel.py) under its processor (state/processor.py), driven through a
stand-in of the processor's handle that keeps PySpark's state semantics in memory (no JVM): a
list of chunks, a meta value, the registered timers."""
import base64
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.conversion import PandasToArrowConversion
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from state.columns import ENVELOPE, WHEEL_OUT
from state.envelope import Rules
from state.parse import parse_batch
from state.placement import partition_of
from state.processor import WheelProcessor
from state.timing import (correct_deliver_timestamp, correct_deliver_timestamps, fire_horizon,
                          slot_of, timer_for)
from state.wheel import BUCKET_DEAD, BUCKET_NOW, WheelConfig, decode_chunks, encode

NOW = 1_700_000_000_000
RULES = Rules((1_000, 2_000, 3_000), "in", "in.DLQ", allowed_topics=frozenset(),
              max_delay_ms=30 * 86_400_000, clock_tolerance_ms=60_000, near_horizon_ms=600_000,
              cold_bucket_ms=3_600_000, timer_parts=8)
CONFIG = WheelConfig(slot_ms=1_000, lead_ms=500, lead_per_message_us=0,
                     watermark_delay_ms=10_000, dlq_topic="in.DLQ", chunk_bytes=1 << 20,
                     timer_parts=8)


def intake(*rows):
    """rows: (headers, offset) → an intake batch as Spark's Kafka source hands it over,
    appended at NOW."""
    return pa.record_batch({
        "key": pa.array([b"k"] * len(rows), pa.binary()),
        "value": pa.array([f"v{o}".encode() for _, o in rows], pa.binary()),
        "ipart": pa.array([0] * len(rows), pa.int32()),
        "ioff": pa.array([o for _, o in rows], pa.int64()),
        "append_ms": pa.array([NOW] * len(rows), pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in h] for h, _ in rows],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })


class Value:
    def __init__(self):
        self.value, self.writes = None, 0

    def get(self):
        return self.value

    def update(self, value):
        self.value, self.writes = tuple(value), self.writes + 1

    def clear(self):
        self.value = None


class Chunks:
    def __init__(self):
        self.rows, self.calls = [], []

    def get(self):
        return iter(list(self.rows))

    def appendValue(self, row):
        self.rows.append(tuple(row))
        self.calls.append("append")

    def put(self, rows):
        self.rows = [tuple(r) for r in rows]
        self.calls.append("put")

    def clear(self):
        self.rows = []
        self.calls.append("clear")


class Handle:
    """One grouping key's state, as the processor's handle shows it."""

    def __init__(self):
        self.chunks, self.meta, self.timers = Chunks(), Value(), set()

    def getListState(self, name, schema):
        assert name == "chunks"
        return self.chunks

    def getValueState(self, name, schema):
        assert name == "meta"
        return self.meta

    def registerTimer(self, ms):
        self.timers.add(ms)

    def deleteTimer(self, ms):
        assert ms in self.timers, f"deleted a timer that is not registered: {ms}"
        self.timers.remove(ms)


class Group:
    """A wheel group's state (`handle`) and one call's Spark watermark; `timed_out`: the call
    is the group's timer's."""

    def __init__(self, watermark_ms: int, handle: Handle, timed_out: bool):
        self.watermark_ms, self.handle, self.timed_out = watermark_ms, handle, timed_out

    @property
    def exists(self) -> bool:
        return self.handle.meta.value is not None

    @property
    def chunks(self) -> list[str]:
        return [row[0] for row in self.handle.chunks.rows]

    @property
    def meta(self) -> tuple[int, int]:
        """(count, earliest due ms)."""
        return self.handle.meta.value[:2]

    @property
    def timer(self) -> int:
        """The group's one registered timer, in Spark's watermark units."""
        (timer,) = self.handle.timers
        return timer

    @property
    def removed(self) -> bool:
        return not self.exists and not self.handle.chunks.rows and not self.handle.timers


def state(watermark_ms, of: Group | None = None, timed_out=False) -> Group:
    """A call's view of a group: a new one, or `of`'s state."""
    return Group(watermark_ms, of.handle if of else Handle(), timed_out)


# As PySpark's worker writes a transformWithStateInPandas output frame (its serializer's
# create_batch with Spark's default settings): one struct column of the output type.
OUT_TYPE = StructType([StructField("_0", from_arrow_schema(WHEEL_OUT))])


def to_arrow(frame: pd.DataFrame) -> None:
    PandasToArrowConversion.convert([frame], OUT_TYPE, timezone="UTC", safecheck=False,
                                    arrow_cast=True, assign_cols_by_name=True)


def run(frame, st, config=CONFIG, key=(2, 0)):
    """One call for a group: `frame`'s rows, or, empty, none (`key` names its group then)."""
    proc = WheelProcessor(config)
    proc.init(st.handle)
    key = (int(frame["bucket"].iloc[0]), int(frame["slot"].iloc[0])) if len(frame) else key
    values = TimerValues(currentWatermarkInMs=st.watermark_ms)
    if st.timed_out:
        timer = st.timer
        st.handle.timers.remove(timer)   # Spark drops an expired timer before the call
        out = list(proc.handleExpiredTimer(key, values, ExpiredTimerInfo(timer)))
    else:
        out = list(proc.handleInputRows(key, iter([frame] if len(frame) else []), values))
    for part in out:  # what PySpark's worker does with each frame: to Arrow
        to_arrow(part)
    rows = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["kind"])
    run.tally = rows[rows["kind"] == "tally"]
    return rows[rows["kind"] != "tally"].reset_index(drop=True)


def envelopes(*rows):
    """Parsed envelopes as PySpark hands them to the wheel: a pandas frame."""
    return parse_batch(intake(*rows), RULES, 1_000, 2, NOW).to_pandas()


def test_delayed_messages_wait_in_state_with_a_timer_lead_before_due():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1))
    st = state(watermark_ms=NOW - 10_000)   # real watermark == NOW
    out = run(frame, st)
    assert out.empty, "due in 2 s, lead 0.5 s: nothing fires yet"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) == [(2, 1, 1)]
    assert st.meta == (1, NOW + 2_000)
    assert decode_chunks(st.chunks).num_rows == 1
    # The Spark timer is in Spark's watermark units (real time minus the watermark delay).
    assert st.timer == NOW + 2_000 - 500 - 10_000


def test_timeout_releases_messages_due_before_the_horizon_with_their_own_headers():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a"), ("u", b"1")], 1))
    st = state(NOW - 10_000)
    run(frame, st)
    fired = state(NOW + 1_600 - 10_000, of=st, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired)
    assert list(out["kind"]) == ["deliver"]
    row = out.iloc[0]
    assert (row["topic"], row["due_ms"], row["uniq_key"]) == ("t", NOW + 2_000, "a")
    assert (list(row["hkeys"]), list(row["hvals"])) == (["u"], [b"1"]), "control headers cut"
    assert fired.removed
    assert list(run.tally["pending_delta"]) == [-1]


def test_messages_beyond_the_horizon_stay_with_a_new_timer():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"b")], 2))
    frame["bucket"], frame["slot"] = 9, 0  # same group for the test
    st = state(NOW + 600 - 10_000)
    out = run(frame, st)
    assert list(out["uniq_key"]) == ["a"]
    assert st.meta == (1, NOW + 3_000)


def test_immediate_and_dead_pass_through_without_state():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"now")], 1),
                      ([("DELAY", b"1")], 2), ([("DELAYQ_HEARTBEAT", b"1")], 3))
    for bucket in (BUCKET_NOW, BUCKET_DEAD):
        part = frame[frame["bucket"] == bucket]
        st = state(NOW - 10_000)
        out = run(part, st)
        assert st.removed, "no state, no timer"
        if bucket == BUCKET_NOW:
            assert list(out["kind"]) == ["deliver"], "heartbeats are dropped"
            assert list(zip(run.tally["level"], run.tally["received"])) == [(0, 1)]
        else:
            assert list(out["kind"]) == ["dead"]
            assert out.iloc[0]["topic"] == "in.DLQ"
            assert out.iloc[0]["reason"] == "missing_real_topic: header REAL_TOPIC is missing"
            assert list(out.iloc[0]["hkeys"]) == ["DELAY"], "original headers kept"


def test_cancel_drops_a_pending_message_and_reports_unknown_ones():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"b")], 2),
                      ([("TIMER_DEL_UNIQKEY", b"a"), ("DELAY", b"2")], 3),
                      ([("TIMER_DEL_UNIQKEY", b"zzz"), ("DELAY", b"2")], 4))
    frame["bucket"], frame["slot"] = 2, 0
    st = state(NOW - 10_000)
    out = run(frame, st)
    assert sorted(zip(out["kind"], out["uniq_key"])) == [("cancel_unknown", "zzz"),
                                                        ("cancelled", "a")]
    assert decode_chunks(st.chunks).column("uniq_key").to_pylist() == ["b"]


def test_parse_cuts_control_headers_and_keeps_all_headers_of_a_dead_letter():
    batch = intake(([("a", b"1"), ("REAL_TOPIC", b"t"), ("b", None), ("DELAY", b"1")], 1),
                   ([("DELAY", b"1"), ("x", b"y")], 2),
                   ([], 3))
    # A record without headers may come as a null list.
    batch = batch.set_column(5, "headers", pa.array(
        batch.column("headers").to_pylist()[:2] + [None], batch.schema.field("headers").type))
    out = parse_batch(batch, RULES, 1_000, 2, NOW).to_pylist()
    assert [r["kind"] for r in out] == ["delay", "dead", "dead"]
    assert (out[0]["hkeys"], out[0]["hvals"]) == (["a", "b"], [b"1", None])
    assert (out[1]["hkeys"], out[1]["hvals"]) == (["DELAY", "x"], [b"1", b"y"])
    assert (out[2]["hkeys"], out[2]["hvals"]) == ([], [])
    assert [r["value"] for r in out] == [b"v1", b"v2", b"v3"]


def test_due_times_are_corrected_as_one_rule_for_arrays_and_scalars():
    due = np.array([1_100, 1_200, 5_000, 0])
    delay = np.array([1_000, 1_000, 10_000, 0])
    assert correct_deliver_timestamps(100, due, delay, 50).tolist() == [
        correct_deliver_timestamp(100, int(d), int(x), 50) for d, x in zip(due, delay)] == [
        1_100, 100, 5_000, 0]


def test_a_large_group_fires_ahead_by_its_size_and_its_timer_releases_it():
    config = replace(CONFIG, lead_per_message_us=1_000)
    assert config.lead_for(10, -1) == 500 + 10 * CONFIG.timer_parts
    assert config.lead_for(10, 2) == 500 + 10, "a level slot is one group"
    rows = [([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 60_000).encode()),
              ("UNIQ_KEY", f"k{i}".encode())], i) for i in range(10)]
    frame = envelopes(*rows)
    frame["bucket"], frame["slot"] = -1, 0  # one group for the test
    st = state(NOW - 10_000)
    assert run(frame, st, config=config).empty
    timer = st.timer + 10_000
    assert timer == NOW + 60_000 - config.lead_for(10, -1)
    fired = state(timer - 10_000, of=st, timed_out=True)
    out = run(frame.iloc[:0], fired, config=config, key=(-1, 0))
    assert list(out["kind"]) == ["deliver"] * 10 and fired.removed, \
        "the timer's call releases the group"


@pytest.mark.parametrize("parts", [8, 16])
def test_a_timer_cancel_reaches_the_group_part_of_the_timer_it_names(parts):
    rules = replace(RULES, timer_parts=parts)
    due = str(NOW + 30_000).encode()
    send = parse_batch(intake(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", due),
                                ("UNIQ_KEY", b"m-7")], 1)), rules, 1_000, 2, NOW).to_pylist()[0]
    cancel = parse_batch(intake(([("TIMER_DEL_UNIQKEY", b"m-7"), ("TIMER_DELIVER_MS", due)], 2)),
                         rules, 1_000, 2, NOW).to_pylist()[0]
    assert cancel["kind"] == "cancel"
    assert (cancel["bucket"], cancel["slot"]) == (send["bucket"], send["slot"])
    groups = {parse_batch(intake(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", due),
                                   ("UNIQ_KEY", f"m-{i}".encode())], i)), rules, 1_000, 2,
                          NOW).to_pylist()[0]["slot"] for i in range(256)}
    assert len(groups) == parts, "timers of one slot spread over its parts (timer_parts)"
    half = parts // 2
    assert sorted(partition_of(-1, slot, 2) for slot in groups) == [0] * half + [1] * half, \
        "and its parts over the two state partitions, half each"


def timers(*keys_due, first_offset=1):
    """Timer envelopes (UNIQ_KEY, due ms) of one wheel group (bucket -1, slot 0)."""
    frame = envelopes(*[([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(due).encode()),
                          ("UNIQ_KEY", key.encode())], first_offset + i)
                        for i, (key, due) in enumerate(keys_due)])
    frame["bucket"], frame["slot"] = -1, 0
    return frame


def test_messages_added_to_a_group_that_does_not_fire_are_appended_as_a_chunk():
    """A later batch's messages for a held group are appended to its state as a chunk of their
    own (the held chunk is not read or written again); one due already leaves at once. The group's count, earliest due time and timer are the whole group's, and its timer
    releases every message of every chunk."""
    st = state(NOW - 10_000)
    assert run(timers(("a", NOW + 30_000), ("b", NOW + 40_000)), st).empty
    first = st.chunks
    later = state(NOW - 10_000, of=st)
    out = run(timers(("c", NOW + 20_000), ("d", NOW + 100), ("e", NOW + 50_000), first_offset=3),
              later)
    assert list(out["uniq_key"]) == ["d"], "due within the lead: leaves at once"
    assert later.chunks[:1] == first and len(later.chunks) == 2
    assert later.handle.chunks.calls == ["put", "append"]
    assert later.meta == (4, NOW + 20_000)
    assert decode_chunks(later.chunks).column("uniq_key").to_pylist() == ["a", "b", "c", "e"]
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(3, 2)]
    assert later.timer + 10_000 == NOW + 20_000 - CONFIG.lead_for(4, -1)

    fired = state(NOW + 60_000 - 10_000, of=later, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired)
    assert sorted(out["uniq_key"]) == ["a", "b", "c", "e"] and fired.removed
    assert list(run.tally["pending_delta"]) == [-4]


def test_a_chunk_is_the_standard_base64_of_an_arrow_stream_both_ways():
    """State written by earlier versions (the standard library's codec) reads the same, and
    what this version writes, the standard library reads."""
    st = state(NOW - 10_000)
    run(timers(("a", NOW + 30_000), ("b", NOW + 40_000)), st)
    (chunk,) = st.chunks
    raw = base64.b64decode(chunk, validate=True)
    assert base64.b64encode(raw).decode() == chunk
    table = pa.ipc.open_stream(raw).read_all()
    assert decode_chunks([base64.b64encode(raw).decode()]).equals(table)
    assert encode(table, CONFIG.chunk_bytes) == [chunk]
    with pytest.raises(ValueError):
        decode_chunks([chunk[:-5] + "!" + chunk[-4:]])


def test_a_group_is_kept_in_chunks_of_at_most_the_bound_in_order():
    """However many messages a group takes in one batch, each chunk of its state holds about
    chunk_bytes of them at most, and the group reads back whole, in order, and fires whole."""
    keys = [(f"k{i:04d}", NOW + 30_000 + i) for i in range(3_000)]
    frame = timers(*keys)
    frame["value"] = [b"v" * 1_000] * len(frame)
    config = replace(CONFIG, chunk_bytes=256 * 1024)
    st = state(NOW - 10_000)
    assert run(frame, st, config=config).empty
    sizes = [decode_chunks([c]).nbytes for c in st.chunks]
    assert len(sizes) >= 12 and max(sizes) <= config.chunk_bytes, sizes
    assert decode_chunks(st.chunks).column("uniq_key").to_pylist() == [k for k, _ in keys]
    fired = state(NOW + 40_000 - 10_000, of=st, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired, config=config)
    assert list(out["uniq_key"]) == [k for k, _ in keys] and fired.removed


def test_a_group_read_whole_again_is_written_back_as_one_chunk():
    """A cancel (or a message that fires) reads every chunk; what stays is one chunk again."""
    st = state(NOW - 10_000)
    run(timers(("a", NOW + 30_000)), st)
    run(timers(("b", NOW + 40_000), first_offset=2), st := state(NOW - 10_000, of=st))
    assert len(st.chunks) == 2
    cancel = envelopes(([("TIMER_DEL_UNIQKEY", b"a"), ("TIMER_DELIVER_MS", str(NOW + 30_000).encode())], 9))
    cancel["bucket"], cancel["slot"] = -1, 0
    out = run(cancel, st := state(NOW - 10_000, of=st))
    assert list(zip(out["kind"], out["uniq_key"])) == [("cancelled", "a")]
    assert len(st.chunks) == 1 and st.meta[0] == 1 and st.handle.chunks.calls[-1] == "put"
    assert decode_chunks(st.chunks).column("uniq_key").to_pylist() == ["b"]


def test_a_message_rolled_in_twice_is_held_once_and_fires_once():
    """A roll retried after a crash brings a held message in again; it must leave once, and
    it still does when the copy arrives already due (the path that skips the state)."""
    first = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1))
    st = state(NOW - 10_000)
    assert run(first, st).empty
    again = envelopes(([("REAL_TOPIC", b"t"), ("DELAYQ_ROLLED", b"2"),
                        ("TIMER_DELIVER_MS", str(NOW + 2_000).encode()), ("UNIQ_KEY", b"a")], 7),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"b")], 8))
    again["bucket"], again["slot"] = first["bucket"].iloc[0], first["slot"].iloc[0]
    assert list(again["rolled"]) == [True, False]
    fired = state(NOW + 2_000 - 10_000, of=st)
    out = run(again, fired)
    assert list(zip(out["uniq_key"], out["ioff"])) == [("a", 1), ("b", 8)], \
        "the held copy of a leaves, once; b, due on arrival, after it"
    assert fired.removed
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(1, -1)], \
        "b taken in, a delivered: one fewer pending (the dropped copy was never pending twice)"


def test_a_message_due_on_arrival_leaves_as_it_would_from_the_state():
    """The same message, once held and fired by its timer, once already due when it arrives:
    the wheel's output rows are equal in every column."""
    message = ([("REAL_TOPIC", b"t"), ("REAL_QID", b"3"), ("DELAY", b"1"), ("UNIQ_KEY", b"a"),
                ("h", b"\x00\xff"), ("h", None)], 5)
    held = state(NOW - 10_000)
    assert run(envelopes(message), held).empty
    timed_out = state(NOW + 1_000 - 10_000, of=held, timed_out=True)
    from_state = run(pd.DataFrame(columns=ENVELOPE.names), timed_out)
    on_arrival = run(envelopes(message), state(NOW + 1_000 - 10_000))
    assert list(on_arrival["kind"]) == ["deliver"]
    for name in WHEEL_OUT.names:
        a, b = from_state.iloc[0][name], on_arrival.iloc[0][name]
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert list(a) == list(b), name
        else:
            assert a == b or (pd.isna(a) and pd.isna(b)), name
    assert on_arrival.iloc[0]["partition"] == 3 and list(on_arrival.iloc[0]["hvals"]) == [b"\x00\xff", None]


def test_a_new_query_s_first_batch_takes_the_job_s_start_for_its_missing_watermark():
    """Spark's first batch of a new query has no watermark yet (it passes 0). The job's start
    stands in for it: a message overdue at the start fires in that batch, one due later waits
    in state with its timer; once Spark has a watermark, the start is ignored."""
    config = replace(CONFIG, first_watermark_ms=NOW + 5_000)
    overdue = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"old")], 1))
    later = envelopes(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 9_000).encode()),
                        ("UNIQ_KEY", b"new")], 2))

    first = state(0)
    assert list(run(overdue, first, config)["uniq_key"]) == ["old"]
    assert first.removed

    held = state(0)
    assert run(later, held, config).empty
    assert held.timer + 10_000 == NOW + 9_000 - 500, "its timer, as in any batch"

    # A later batch whose Spark watermark (real time NOW) is behind the job's start: Spark's
    # watermark rules, and the overdue message waits for it like any other.
    second = state(NOW - 10_000)
    assert run(overdue, second, config).empty and second.exists

    # Without a start (the default), a first batch holds everything, as Spark's watermark says.
    untouched = state(0)
    assert run(overdue, untouched).empty and untouched.exists


def test_level_messages_due_before_the_checkpoint_s_start_pass_through_without_state():
    """Due before the checkpoint's first start: a level message goes out with the immediate
    ones, spread by intake offset, at its own due time and level; a timer (a cancel names its
    group), a rolled-in message and one due later keep to the wheel."""
    rows = (([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"old-a")], 4),
            ([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"old-b")], 5),
            ([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 1_500).encode()),
              ("UNIQ_KEY", b"timer")], 6),
            ([("REAL_TOPIC", b"t"), ("DELAYQ_ROLLED", b"1"), ("TIMER_DELIVER_MS", str(NOW + 1_000).encode()),
              ("UNIQ_KEY", b"rolled")], 7),
            ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"later")], 8))
    # Appended at NOW: "old-*" due at NOW + 1 s and the timer at NOW + 1.5 s, before the start
    # at NOW + 2 s; "later" after it.
    parsed = parse_batch(intake(*rows), RULES, 1_000, 2, NOW, overdue_before_ms=NOW + 2_000)
    by_key = {r["uniq_key"]: r for r in parsed.to_pylist()}
    assert [(by_key[k]["kind"], by_key[k]["bucket"]) for k in ("old-a", "old-b")] \
        == [("now", BUCKET_NOW)] * 2
    assert sorted(partition_of(BUCKET_NOW, by_key[k]["slot"], 2) for k in ("old-a", "old-b")) \
        == [0, 1], "spread over both state partitions"
    assert (by_key["old-a"]["level"], by_key["old-a"]["due_ms"]) == (1, NOW + 1_000)
    assert [by_key[k]["kind"] for k in ("timer", "rolled", "later")] == ["delay"] * 3
    assert by_key["rolled"]["rolled"] and by_key["rolled"]["bucket"] == 1
    assert parse_batch(intake(*rows), RULES, 1_000, 2, NOW).column("kind").to_pylist() \
        == ["delay"] * 5, "without a start, every one keeps to the wheel"

    frame = parsed.to_pandas()
    passing = frame[frame["uniq_key"] == "old-a"].reset_index(drop=True)   # its group's rows
    st = state(NOW - 10_000)
    out = run(passing, st)
    assert list(zip(out["kind"], out["uniq_key"], out["level"], out["due_ms"])) == [
        ("deliver", "old-a", 1, NOW + 1_000)]
    assert st.removed, "no state, no timer"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) \
        == [(1, 1, 0)], "counted as taken in at its level, never pending"


def test_time_rules():
    # Beyond now + delay by more than the tolerance (50): a clock moved, deliver now.
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_151, delay_ms=1_000,
                                     clock_tolerance_ms=50) == 100
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_150, delay_ms=1_000,
                                     clock_tolerance_ms=50) == 1_150
    assert slot_of(2_999, 1_000) == 2
    assert fire_horizon(5_000, 700) == 5_700
    assert timer_for(10_000, 2_000, watermark_ms=1_000) == 8_000
    assert timer_for(10_000, 2_000, watermark_ms=9_000) == 9_001
