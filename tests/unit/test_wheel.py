"""The wheel (state/wheel.py), driven through PySpark's own GroupState class as
applyInPandasWithState hands it to the function (pure Python, no JVM)."""
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.conversion import PandasToArrowConversion
from pyspark.serializers import CPickleSerializer
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import StructField, StructType

from state.columns import BODY, ENVELOPE, INDEX_ENVELOPE, REFERENCE, WHEEL_OUT
from state.envelope import Kind, Rules
from state.parse import parse_batch
from state.placement import partition_of
from state.timing import correct_deliver_timestamps, timer_for
from state.wheel import BUCKET_DEAD, BUCKET_NOW, WheelConfig, group_of, make_wheel
from streaming.wheel.schema import STATE_SPARK

NOW = 1_700_000_000_000
from tests.support import KEY, rolled_header  # noqa: F401
RULES = Rules((1_000, 2_000, 3_000), "in", "in.DLQ", allowed_topics=frozenset(),
              max_delay_ms=30 * 86_400_000, clock_tolerance_ms=60_000, near_horizon_ms=600_000,
              cold_bucket_ms=3_600_000, timer_parts=8, ring_horizon_ms=0,
              rolls_to_ring=False, seal_key=KEY,
              legacy_before=())
CONFIG = WheelConfig(slot_ms=1_000, lead_ms=500, lead_per_message_us=0,
                     watermark_delay_ms=10_000, dlq_topic="in.DLQ", timer_parts=8, spread=4,
                     direct_max_delay_ms=-1)


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


def state(watermark_ms, of=None, timed_out=False) -> GroupState:
    """A call's view of a group, as applyInPandasWithState hands it over: a new group, or what
    `of` (an earlier call's state) kept, and whether its timeout fired."""
    kept = of is not None and of.exists
    return GroupState(
        optionalValue=of._value if kept else None, batchProcessingTimeMs=NOW,
        eventTimeWatermarkMs=watermark_ms, timeoutConf=GroupStateTimeout.EventTimeTimeout,
        hasTimedOut=timed_out, watermarkPresent=True, defined=kept, updated=False,
        removed=False, timeoutTimestamp=-1, keyAsUnsafe=b"", valueSchema=STATE_SPARK)


def held(st: GroupState) -> pa.Table:
    """The references a group's state holds (checked against its count and earliest due)."""
    count, earliest, refs = st.get
    table = pa.table(json.loads(refs))
    assert table.schema.names == REFERENCE.names and table.num_rows == count
    assert earliest == min(table.column("due_ms").to_pylist())
    return table


def timeout(st: GroupState) -> int:
    """The group's event-time timeout, in Spark's watermark units."""
    return st._timeout_timestamp


def removed(st: GroupState) -> bool:
    return not st.exists


# As PySpark's applyInPandasWithState serializer writes a call's output: every frame to Arrow,
# and the state the call kept, pickled, to the JVM.
PICKLE = CPickleSerializer()


def run(frame, st, config=CONFIG, key=(2, 0)):
    """One call for a group: `frame`'s rows, or, empty, none (`key` names its group then)."""
    wheel = make_wheel(config)
    key = (int(frame["bucket"].iloc[0]), int(frame["slot"].iloc[0])) if len(frame) else key
    out = list(wheel(key, iter([frame] if len(frame) else []), st))
    for part in out:  # what PySpark's worker does with each frame: to Arrow
        PandasToArrowConversion.convert([part], OUT_TYPE, timezone="UTC", safecheck=False,
                                        arrow_cast=True, assign_cols_by_name=True)
    if st.exists:   # and what it does with the state: pickled for the JVM
        PICKLE.dumps(STATE_SPARK.toInternal(st._value))
    rows = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["kind"])
    run.tally = rows[rows["kind"] == "tally"]
    return rows[rows["kind"] != "tally"].reset_index(drop=True)


OUT_TYPE = StructType([StructField("_0", from_arrow_schema(WHEEL_OUT))])


def envelopes(*rows):
    """Parsed envelopes as PySpark hands them to the wheel: a pandas frame of the index layout
    (the wheel query hands its parse no key and no value)."""
    batch = intake(*rows)
    index = batch.select([name for name in batch.schema.names if name not in ("key", "value")])
    return parse_batch(index, RULES, 1_000, 2, NOW).to_pandas()


EMPTY = pd.DataFrame(columns=INDEX_ENVELOPE.names)


def test_delayed_messages_wait_in_state_as_references_with_a_timeout_lead_before_due():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1))
    st = state(watermark_ms=NOW - 10_000)   # real watermark == NOW
    out = run(frame, st)
    assert out.empty, "due in 2 s, lead 0.5 s: nothing fires yet"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) == [(2, 1, 1)]
    assert held(st).to_pylist() == [
        {"ipart": 0, "ioff": 1, "append_ms": NOW, "due_ms": NOW + 2_000, "uniq_key": "a"}]
    # The timeout is in Spark's watermark units (real time minus the watermark delay).
    assert timeout(st) == NOW + 2_000 - 500 - 10_000


def test_timeout_releases_the_references_due_before_the_horizon():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a"), ("u", b"1")], 1))
    st = state(NOW - 10_000)
    run(frame, st)
    fired = state(NOW + 1_600 - 10_000, of=st, timed_out=True)
    out = run(EMPTY, fired)
    assert list(out["kind"]) == ["deliver"]
    row = out.iloc[0]
    assert (row["due_ms"], row["uniq_key"], row["level"], row["ipart"], row["ioff"],
            row["append_ms"]) == (NOW + 2_000, "a", 2, 0, 1, NOW)
    assert row["topic"] is None, "the dispatch reads the topic back with the body"
    assert removed(fired)
    assert list(run.tally["pending_delta"]) == [-1]


def test_messages_beyond_the_horizon_stay_with_a_new_timeout():
    frame = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("UNIQ_KEY", b"a")], 1),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"b")], 2))
    frame["bucket"], frame["slot"] = 9, 0  # same group for the test
    st = state(NOW + 600 - 10_000)
    out = run(frame, st)
    assert list(out["uniq_key"]) == ["a"]
    assert held(st).column("due_ms").to_pylist() == [NOW + 3_000]
    assert timeout(st) == NOW + 3_000 - 500 - 10_000


def test_immediate_dead_and_cold_pass_through_without_state():
    far = str(NOW + 5 * 3_600_000).encode()
    frame = envelopes(([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"now")], 1),
                      ([("DELAY", b"1")], 2), ([("DELAYQ_HEARTBEAT", b"1")], 3),
                      ([("REAL_TOPIC", b"t"), ("REAL_QID", b"4"), ("TIMER_DELIVER_MS", far),
                        ("UNIQ_KEY", b"cold")], 4))
    for bucket in (BUCKET_NOW, BUCKET_DEAD, -3):
        part = frame[frame["bucket"] == bucket]
        st = state(NOW - 10_000)
        out = run(part, st)
        assert removed(st) and timeout(st) == -1, "no state, no timeout"
        if bucket == BUCKET_NOW:
            assert list(out["kind"]) == ["deliver"], "heartbeats are dropped"
            assert (out.iloc[0]["level"], out.iloc[0]["ioff"]) == (0, 1)
            assert list(zip(run.tally["level"], run.tally["received"])) == [(0, 1)]
        elif bucket == BUCKET_DEAD:
            assert list(out["kind"]) == ["dead"]
            assert (out.iloc[0]["topic"], out.iloc[0]["ioff"]) == ("in.DLQ", 2)
            assert out.iloc[0]["reason"] == "missing_real_topic: header REAL_TOPIC is missing"
        else:
            assert list(zip(out["kind"], out["topic"], out["partition"], out["ioff"])) == [
                ("cold", "t", 4, 4)], "the job parks it with its record read back"


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
    assert held(st).column("uniq_key").to_pylist() == ["b"]
    # And later, from the state.
    cancel = envelopes(([("TIMER_DEL_UNIQKEY", b"b"), ("DELAY", b"2")], 5))
    cancel["bucket"], cancel["slot"] = 2, 0
    out = run(cancel, st := state(NOW - 10_000, of=st))
    assert list(zip(out["kind"], out["uniq_key"])) == [("cancelled", "b")] and removed(st)


def test_the_wheel_s_parse_gets_no_body_and_returns_the_index_layout():
    batch = intake(([("a", b"1"), ("REAL_TOPIC", b"t"), ("b", None), ("DELAY", b"1")], 1),
                   ([("DELAY", b"1"), ("x", b"y")], 2))
    index = parse_batch(batch.drop_columns(["key", "value"]), RULES, 1_000, 2, NOW)
    whole = parse_batch(batch, RULES, 1_000, 2, NOW)
    assert index.schema == INDEX_ENVELOPE and whole.schema == ENVELOPE
    assert not set(BODY) & set(INDEX_ENVELOPE.names)
    assert index.to_pylist() == whole.drop_columns(list(BODY)).to_pylist(), \
        "the same decisions with or without the body"


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


def test_due_times_are_corrected_within_the_clock_tolerance():
    # Beyond now + delay by more than the tolerance (50): a clock moved, deliver now.
    due = np.array([1_150, 1_151, 5_000, 0])
    delay = np.array([1_000, 1_000, 10_000, 0])
    assert correct_deliver_timestamps(100, due, delay, 50).tolist() == [1_150, 100, 5_000, 0]


def test_a_large_group_fires_ahead_by_its_size_and_its_timeout_releases_it():
    config = replace(CONFIG, lead_per_message_us=1_000)
    assert config.lead_for(10, -1) == 500 + 10 * CONFIG.timer_parts
    assert config.lead_for(10, 2) == 500 + 10, "a level slot is one group"
    rows = [([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(NOW + 60_000).encode()),
              ("UNIQ_KEY", f"k{i}".encode())], i) for i in range(10)]
    frame = envelopes(*rows)
    frame["bucket"], frame["slot"] = -1, 0  # one group for the test
    st = state(NOW - 10_000)
    assert run(frame, st, config=config).empty
    fires = timeout(st) + 10_000
    assert fires == NOW + 60_000 - config.lead_for(10, -1)
    fired = state(fires - 10_000, of=st, timed_out=True)
    out = run(frame.iloc[:0], fired, config=config, key=(-1, 0))
    assert list(out["kind"]) == ["deliver"] * 10 and removed(fired), \
        "the timeout's call releases the group"


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


def test_a_later_batch_adds_to_the_held_references_and_the_timeout_is_the_whole_group_s():
    """A later batch's messages for a held group join its references; one due already leaves
    at once. The timeout is set again on every call (Spark clears it after it fires), from the
    whole group's earliest due time, and releases every reference."""
    st = state(NOW - 10_000)
    assert run(timers(("a", NOW + 30_000), ("b", NOW + 40_000)), st).empty
    later = state(NOW - 10_000, of=st)
    out = run(timers(("c", NOW + 20_000), ("d", NOW + 100), ("e", NOW + 50_000), first_offset=3),
              later)
    assert list(out["uniq_key"]) == ["d"], "due within the lead: leaves at once"
    assert held(later).column("uniq_key").to_pylist() == ["a", "b", "c", "e"]
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(3, 2)]
    assert timeout(later) + 10_000 == NOW + 20_000 - CONFIG.lead_for(4, -1)

    fired = state(NOW + 60_000 - 10_000, of=later, timed_out=True)
    out = run(EMPTY, fired, key=(-1, 0))
    assert sorted(out["uniq_key"]) == ["a", "b", "c", "e"] and removed(fired)
    assert list(run.tally["pending_delta"]) == [-4]


def test_a_group_s_state_costs_at_most_100_bytes_a_reference():
    """A burst's group part (62,500 timers, `timer_parts` 8) costs Spark's state at most 100
    bytes a reference, as pickled for the JVM."""
    keys = [(f"bench-burst-{i}", NOW + 30_000 + i % 1_000) for i in range(62_500)]
    st = state(NOW - 10_000)
    assert run(timers(*keys), st).empty
    assert held(st).column("uniq_key").to_pylist() == [k for k, _ in keys]
    pickled = PICKLE.dumps(STATE_SPARK.toInternal(st._value))
    assert len(pickled) / len(keys) <= 100, len(pickled) / len(keys)


def test_a_message_rolled_in_twice_is_held_once_and_fires_once():
    """A roll retried after a crash brings a held message in again; it must leave once, and
    it still does when the copy arrives already due (the path that skips the state)."""
    first = envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"a")], 1))
    st = state(NOW - 10_000)
    assert run(first, st).empty
    again = envelopes(([("REAL_TOPIC", b"t"), rolled_header(2, NOW + 2_000, "a", "t"),
                        ("TIMER_DELIVER_MS", str(NOW + 2_000).encode()), ("UNIQ_KEY", b"a")], 7),
                      ([("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("UNIQ_KEY", b"b")], 8))
    again["bucket"], again["slot"] = first["bucket"].iloc[0], first["slot"].iloc[0]
    assert list(again["rolled"]) == [True, False]
    fired = state(NOW + 2_000 - 10_000, of=st)
    out = run(again, fired)
    assert list(zip(out["uniq_key"], out["ioff"])) == [("a", 1), ("b", 8)], \
        "the held copy of a leaves, once; b, due on arrival, after it"
    assert removed(fired)
    assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(1, -1)], \
        "b taken in, a delivered: one fewer pending (the dropped copy was never pending twice)"


def test_a_rolled_timer_the_wheel_holds_is_pending_again_a_rolled_level_stays_so():
    """The roll counts its timers out of the wheel's pending (sinks/cold.py `roll`: a dispatch
    task's ring counts those it takes); one the wheel holds after all counts in again. A rolled
    level was never counted out. Neither is received twice."""
    due = NOW + 60_000
    for level, uniq, pending in ((-1, "a", 1), (2, "b", 0)):
        frame = envelopes(([("REAL_TOPIC", b"t"), rolled_header(level, due, uniq, "t"),
                            ("TIMER_DELIVER_MS", str(due).encode()),
                            ("UNIQ_KEY", uniq.encode())], 1))
        assert list(frame["rolled"]) == [True]
        assert run(frame, state(NOW - 10_000)).empty
        assert list(zip(run.tally["received"], run.tally["pending_delta"])) == [(0, pending)]


def test_a_message_due_on_arrival_leaves_as_it_would_from_the_state():
    """The same message, once held and fired by its timer, once already due when it arrives:
    the wheel's output rows are equal in every column."""
    message = ([("REAL_TOPIC", b"t"), ("REAL_QID", b"3"), ("DELAY", b"1"), ("UNIQ_KEY", b"a"),
                ("h", b"\x00\xff"), ("h", None)], 5)
    kept = state(NOW - 10_000)
    frame = envelopes(message)
    assert run(frame, kept).empty
    timed_out = state(NOW + 1_000 - 10_000, of=kept, timed_out=True)
    from_state = run(EMPTY, timed_out, key=(frame["bucket"].iloc[0], frame["slot"].iloc[0]))
    on_arrival = run(envelopes(message), state(NOW + 1_000 - 10_000))
    assert list(on_arrival["kind"]) == ["deliver"]
    for name in WHEEL_OUT.names:
        a, b = from_state.iloc[0][name], on_arrival.iloc[0][name]
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert list(a) == list(b), name
        else:
            assert a == b or (pd.isna(a) and pd.isna(b)), name
    assert (on_arrival.iloc[0]["ioff"], on_arrival.iloc[0]["level"]) == (5, 1)


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
    assert removed(first)

    waiting = state(0)
    assert run(later, waiting, config).empty
    assert timeout(waiting) + 10_000 == NOW + 9_000 - 500, "its timeout, as in any batch"

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
            ([("REAL_TOPIC", b"t"), rolled_header(1, NOW + 1_000, "rolled", "t"),
              ("TIMER_DELIVER_MS", str(NOW + 1_000).encode()), ("UNIQ_KEY", b"rolled")], 7),
            ([("REAL_TOPIC", b"t"), ("DELAY", b"3"), ("UNIQ_KEY", b"later")], 8))
    # Appended at NOW: "old-*" due at NOW + 1 s and the timer at NOW + 1.5 s, before the start
    # at NOW + 2 s; "later" after it.
    parsed = parse_batch(intake(*rows).drop_columns(["key", "value"]), RULES, 1_000, 2, NOW,
                         overdue_before_ms=NOW + 2_000)
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
    assert removed(st), "no state, no timeout"
    assert list(zip(run.tally["level"], run.tally["received"], run.tally["pending_delta"])) \
        == [(1, 1, 0)], "counted as taken in at its level, never pending"


def test_time_rules():
    assert group_of(Kind.DELAY, 3, 2_999, 0, 1_000, 1, timer_parts=1) == (3, 2)
    assert timer_for(10_000, 2_000, watermark_ms=1_000) == 8_000
    assert timer_for(10_000, 2_000, watermark_ms=9_000) == 9_001
