"""The wheel function, driven through PySpark's own GroupState class (pure Python, no JVM)."""
import base64
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from state.columns import ENVELOPE
from state.envelope import Rules
from state.parse import parse_batch
from state.placement import partition_of
from state.timing import (correct_deliver_timestamp, correct_deliver_timestamps, fire_horizon,
                          slot_of, timer_for)
from state.wheel import (BUCKET_DEAD, BUCKET_NOW, CHUNK_SEP, TIMER_PARTS, WheelConfig, decode,
                         encode, make_wheel)
from pyspark.sql.pandas.serializers import ApplyInPandasWithStateSerializer

from state.columns import WHEEL_OUT
from streaming.schema import STATE_SPARK

NOW = 1_700_000_000_000
RULES = Rules((1_000, 2_000, 3_000), "in", "in.DLQ", allowed_topics=frozenset(),
              max_delay_ms=30 * 86_400_000, clock_tolerance_ms=60_000, near_horizon_ms=600_000,
              cold_bucket_ms=3_600_000)
CONFIG = WheelConfig((1_000, 2_000, 3_000), slot_ms=1_000, lead_ms=500, lead_per_message_us=0,
                     watermark_delay_ms=10_000, max_delay_ms=30 * 86_400_000,
                     dlq_topic="in.DLQ", chunk_bytes=1 << 20)


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


def state(watermark_ms, value=None, timed_out=False):
    return GroupState(
        optionalValue=value, batchProcessingTimeMs=NOW, eventTimeWatermarkMs=watermark_ms,
        timeoutConf=GroupStateTimeout.EventTimeTimeout, hasTimedOut=timed_out,
        watermarkPresent=True, defined=value is not None, updated=False, removed=False,
        timeoutTimestamp=-1, keyAsUnsafe=b"", valueSchema=STATE_SPARK)


# As pyspark/worker.py builds it for applyInPandasWithState (with state/compat.py's patch,
# which the wheel's module imports).
SERIALIZER = ApplyInPandasWithStateSerializer("UTC", False, True, STATE_SPARK, 10_000, False, False)


def run(frame, st, clock_ms=NOW, config=CONFIG):
    wheel = make_wheel(config, clock=lambda: clock_ms / 1000)
    key = (int(frame["bucket"].iloc[0]), int(frame["slot"].iloc[0])) if len(frame) else (2, 0)
    out = list(wheel(key, iter([frame] if len(frame) else []), st))
    for part in out:  # what PySpark's worker does with each frame: every column to Arrow
        for field in WHEEL_OUT:
            SERIALIZER._create_array(part[field.name], field.type, arrow_cast=True)
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
    assert st.exists
    blob, count, earliest = st.get
    assert (count, earliest) == (1, NOW + 2_000)
    assert decode(blob).num_rows == 1
    # The Spark timer is in Spark's watermark units (real time minus the watermark delay).
    assert st._timeout_timestamp == NOW + 2_000 - 500 - 10_000


def test_timeout_releases_messages_due_before_the_horizon_with_their_own_headers():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a"), ("u", b"1")], 1))
    st = state(NOW - 10_000)
    run(frame, st)
    value = st.get
    fired = state(NOW + 1_600 - 10_000, value=value, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired, clock_ms=NOW + 1_600)
    assert list(out["kind"]) == ["deliver"]
    row = out.iloc[0]
    assert (row["topic"], row["due_ms"], row["uniq_key"]) == ("t", NOW + 2_000, "a")
    assert (list(row["hkeys"]), list(row["hvals"])) == (["u"], [b"1"]), "control headers cut"
    assert fired._removed
    assert list(run.tally["pending_delta"]) == [-1]


def test_messages_beyond_the_horizon_stay_with_a_new_timer():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"b")], 2))
    frame["bucket"], frame["slot"] = 9, 0  # same group for the test
    st = state(NOW + 600 - 10_000)
    out = run(frame, st, clock_ms=NOW + 600)
    assert list(out["uniq_key"]) == ["a"]
    assert st.get[1:] == (1, NOW + 3_000)


def test_immediate_and_dead_pass_through_without_state():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"now")], 1),
                      ([("DELAY", b"1")], 2), ([("DELAYQ_HEARTBEAT", b"1")], 3))
    for bucket in (BUCKET_NOW, BUCKET_DEAD):
        part = frame[frame["bucket"] == bucket]
        st = state(NOW - 10_000)
        out = run(part, st)
        assert not st.exists
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
    assert decode(st.get[0]).column("uniq_key").to_pylist() == ["b"]


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
    assert correct_deliver_timestamps(100, due, delay).tolist() == [
        correct_deliver_timestamp(100, int(d), int(x)) for d, x in zip(due, delay)] == [
        1_100, 100, 5_000, 0]


def test_a_large_group_fires_ahead_by_its_size_and_its_timer_releases_it():
    config = replace(CONFIG, lead_per_message_us=1_000)
    assert config.lead_for(10, -1) == 500 + 10 * TIMER_PARTS
    assert config.lead_for(10, 2) == 500 + 10, "a level slot is one group"
    rows = [([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 60_000).encode()),
              ("UNIQ_KEY", f"k{i}".encode())], i) for i in range(10)]
    frame = envelopes(*rows)
    frame["bucket"], frame["slot"] = -1, 0  # one group for the test
    wheel = make_wheel(config, clock=lambda: NOW / 1000)
    st = state(NOW - 10_000)
    list(wheel((-1, 0), iter([frame]), st))
    timer = st._timeout_timestamp + 10_000
    assert timer == NOW + 60_000 - config.lead_for(10, -1)
    fired = state(timer - 10_000, value=st.get, timed_out=True)
    out = [f for f in wheel((-1, 0), iter([]), fired) if (f["kind"] == "deliver").any()]
    assert sum(len(f) for f in out) == 10 and fired._removed, "the timer's call releases the group"


def test_a_timer_cancel_reaches_the_group_part_of_the_timer_it_names():
    due = str(NOW + 30_000).encode()
    send = parse_batch(intake(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", due),
                                ("UNIQ_KEY", b"m-7")], 1)), RULES, 1_000, 2, NOW).to_pylist()[0]
    cancel = parse_batch(intake(([("TIMER_DEL_UNIQKEY", b"m-7"), ("TIMER_DELIVER_MS", due)], 2)),
                         RULES, 1_000, 2, NOW).to_pylist()[0]
    assert cancel["kind"] == "cancel"
    assert (cancel["bucket"], cancel["slot"]) == (send["bucket"], send["slot"])
    groups = {parse_batch(intake(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", due),
                                   ("UNIQ_KEY", f"m-{i}".encode())], i)), RULES, 1_000, 2,
                          NOW).to_pylist()[0]["slot"] for i in range(64)}
    assert len(groups) == TIMER_PARTS, "timers of one slot spread over its parts"
    assert sorted(partition_of(-1, slot, 2) for slot in groups) == [0] * 4 + [1] * 4, \
        "and its parts over the two state partitions, half each"


def timers(*keys_due, first_offset=1):
    """Timer envelopes (UNIQ_KEY, due ms) of one wheel group (bucket -1, slot 0)."""
    frame = envelopes(*[([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(due).encode()),
                          ("UNIQ_KEY", key.encode())], first_offset + i)
                        for i, (key, due) in enumerate(keys_due)])
    frame["bucket"], frame["slot"] = -1, 0
    return frame


def test_messages_added_to_a_group_that_does_not_fire_are_appended_as_a_chunk():
    """A later batch's messages for a held group are appended to its state text as a chunk
    of their own (the held stream is not decoded and written again); one due already leaves at
    once. The group's count, earliest due time and timer are the whole group's, and its timer
    releases every message of every chunk."""
    st = state(NOW - 10_000)
    assert run(timers(("a", NOW + 30_000), ("b", NOW + 40_000)), st).empty
    first = st.get[0]
    later = state(NOW - 10_000, value=st.get)
    out = run(timers(("c", NOW + 20_000), ("d", NOW + 100), ("e", NOW + 50_000), first_offset=3),
              later)
    assert list(out["uniq_key"]) == ["d"], "due within the lead: leaves at once"
    blob, count, earliest = later.get
    assert blob.startswith(first + CHUNK_SEP) and blob.count(CHUNK_SEP) == 1
    assert (count, earliest) == (4, NOW + 20_000)
    assert decode(blob).column("uniq_key").to_pylist() == ["a", "b", "c", "e"]
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(3, 2)]
    assert later._timeout_timestamp + 10_000 == NOW + 20_000 - CONFIG.lead_for(4, -1)

    fired = state(NOW + 60_000 - 10_000, value=later.get, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired, clock_ms=NOW + 60_000)
    assert sorted(out["uniq_key"]) == ["a", "b", "c", "e"] and fired._removed
    assert list(run.tally["pending_delta"]) == [-4]


def test_a_chunk_is_the_standard_base64_of_an_arrow_stream_both_ways():
    """State written by earlier versions (the standard library's codec) reads the same, and
    what this version writes, the standard library reads."""
    st = state(NOW - 10_000)
    run(timers(("a", NOW + 30_000), ("b", NOW + 40_000)), st)
    chunk = st.get[0]
    raw = base64.b64decode(chunk, validate=True)
    assert base64.b64encode(raw).decode() == chunk
    table = pa.ipc.open_stream(raw).read_all()
    assert decode(base64.b64encode(raw).decode()).equals(table)
    assert encode(table, CONFIG.chunk_bytes) == [chunk]
    with pytest.raises(ValueError):
        decode(chunk[:-5] + "!" + chunk[-4:])


def test_a_group_is_kept_in_chunks_of_at_most_the_bound_in_order():
    """However many messages a group takes in one batch, each chunk of its state holds about
    chunk_bytes of them at most, and the group reads back whole, in order, and fires whole."""
    keys = [(f"k{i:04d}", NOW + 30_000 + i) for i in range(3_000)]
    frame = timers(*keys)
    frame["value"] = [b"v" * 1_000] * len(frame)
    config = replace(CONFIG, chunk_bytes=256 * 1024)
    st = state(NOW - 10_000)
    assert run(frame, st, config=config).empty
    chunks = st.get[0].split(CHUNK_SEP)
    sizes = [decode(c).nbytes for c in chunks]
    assert len(chunks) >= 12 and max(sizes) <= config.chunk_bytes, sizes
    assert decode(st.get[0]).column("uniq_key").to_pylist() == [k for k, _ in keys]
    fired = state(NOW + 40_000 - 10_000, value=st.get, timed_out=True)
    out = run(pd.DataFrame(columns=ENVELOPE.names), fired, clock_ms=NOW + 40_000, config=config)
    assert list(out["uniq_key"]) == [k for k, _ in keys] and fired._removed


def test_a_group_read_whole_again_is_written_back_as_one_chunk():
    """A cancel (or a message that fires) reads every chunk; what stays is one chunk again."""
    st = state(NOW - 10_000)
    run(timers(("a", NOW + 30_000)), st)
    run(timers(("b", NOW + 40_000), first_offset=2), st := state(NOW - 10_000, value=st.get))
    assert st.get[0].count(CHUNK_SEP) == 1
    cancel = envelopes(([("TIMER_DEL_UNIQKEY", b"a"), ("TIMER_DELIVER_MS", str(NOW + 30_000).encode())], 9))
    cancel["bucket"], cancel["slot"] = -1, 0
    out = run(cancel, st := state(NOW - 10_000, value=st.get))
    assert list(zip(out["kind"], out["uniq_key"])) == [("cancelled", "a")]
    assert CHUNK_SEP not in st.get[0] and st.get[1] == 1
    assert decode(st.get[0]).column("uniq_key").to_pylist() == ["b"]


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
    fired = state(NOW + 2_000 - 10_000, value=st.get)
    out = run(again, fired, clock_ms=NOW + 2_000)
    assert list(zip(out["uniq_key"], out["ioff"])) == [("a", 1), ("b", 8)], \
        "the held copy of a leaves, once; b, due on arrival, after it"
    assert fired._removed
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(1, -1)], \
        "b taken in, a delivered: one fewer pending (the dropped copy was never pending twice)"


def test_a_message_due_on_arrival_leaves_as_it_would_from_the_state():
    """The same message, once held and fired by its timer, once already due when it arrives:
    the wheel's output rows are equal in every column."""
    message = ([("REAL_TOPIC", b"t"), ("REAL_QID", b"3"), ("DELAY", b"1"), ("UNIQ_KEY", b"a"),
                ("h", b"\x00\xff"), ("h", None)], 5)
    held = state(NOW - 10_000)
    assert run(envelopes(message), held).empty
    timed_out = state(NOW + 1_000 - 10_000, value=held.get, timed_out=True)
    from_state = run(pd.DataFrame(columns=ENVELOPE.names), timed_out, clock_ms=NOW + 1_000)
    on_arrival = run(envelopes(message), state(NOW + 1_000 - 10_000), clock_ms=NOW + 1_000)
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
    wheel = make_wheel(config, clock=lambda: (NOW + 5_000) / 1000)
    overdue = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"old")], 1))
    later = envelopes(([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 9_000).encode()),
                        ("UNIQ_KEY", b"new")], 2))

    first = state(0)
    out = pd.concat(wheel((3, 0), iter([overdue]), first))
    assert list(out.loc[out["kind"] == "deliver", "uniq_key"]) == ["old"]
    assert not first.exists

    held = state(0)
    assert not any((f["kind"] == "deliver").any() for f in wheel((-1, 0), iter([later]), held))
    assert held._timeout_timestamp + 10_000 == NOW + 9_000 - 500, "its timer, as in any batch"

    # A later batch whose Spark watermark (real time NOW) is behind the job's start: Spark's
    # watermark rules, and the overdue message waits for it like any other.
    second = state(NOW - 10_000)
    out = list(wheel((3, 0), iter([overdue]), second))
    assert not any((f["kind"] == "deliver").any() for f in out) and second.exists

    # Without a start (the default), a first batch holds everything, as Spark's watermark says.
    plain = make_wheel(CONFIG, clock=lambda: (NOW + 5_000) / 1000)
    untouched = state(0)
    assert not any((f["kind"] == "deliver").any() for f in plain((3, 0), iter([overdue]), untouched))
    assert untouched.exists


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
    out = run(passing, st, clock_ms=NOW + 2_000)
    assert list(zip(out["kind"], out["uniq_key"], out["level"], out["due_ms"])) == [
        ("deliver", "old-a", 1, NOW + 1_000)]
    assert not st.exists, "no state"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) \
        == [(1, 1, 0)], "counted as taken in at its level, never pending"


def test_time_rules():
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_200, delay_ms=1_000) == 100
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_100, delay_ms=1_000) == 1_100
    assert slot_of(2_999, 1_000) == 2
    assert fire_horizon(5_000, 700) == 5_700
    assert timer_for(10_000, 2_000, watermark_ms=1_000) == 8_000
    assert timer_for(10_000, 2_000, watermark_ms=9_000) == 9_001
