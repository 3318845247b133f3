"""Property tests of the header rules: any headers a producer can write, in any encoding,
parse to a decision (never an exception), a dead letter always says why, and nothing a
producer writes moves a message before its time."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from state import headers as H
from state.columns import HEADERS
from state.envelope import TIMER_LEVEL, Kind, Rules, parse
from state.parse import parse_batch

RULES = Rules(level_delays_ms=(1_000, 5_000, 10_000, 60_000), intake_topic="intake",
              dlq_topic="intake.DLQ", allowed_topics=frozenset(), max_delay_ms=86_400_000,
              clock_tolerance_ms=60_000, near_horizon_ms=600_000, cold_bucket_ms=3_600_000,
              timer_parts=8)
APPEND = 1_700_000_000_000

CONTRACT_NAMES = sorted(H.CONTROL_HEADERS - {H.HEARTBEAT})
names = st.one_of(st.sampled_from(CONTRACT_NAMES), st.text(max_size=20))
numbers = st.integers(-2**70, 2**70).map(lambda n: str(n).encode())
values = st.one_of(st.none(), st.binary(max_size=40), numbers,
                   st.text(max_size=20).map(lambda t: t.encode("utf-8")),
                   st.sampled_from([b"", b" 3 ", b"1e3", b"\xff\xfe", b"0x10", "３".encode()]))
header_lists = st.lists(st.tuples(names, values), max_size=8)
append_times = st.integers(0, 2**42)


@settings(max_examples=3000)
@given(header_lists, st.integers(0, 2**31 - 1), st.integers(0, 2**62), append_times,
       st.integers(-120_000, 120_000))
def test_any_headers_parse_to_a_decision_and_a_dead_letter_says_why(
        headers, partition, offset, append_ms, clock_skew):
    e = parse(headers, partition, offset, append_ms, RULES, now_ms=append_ms + clock_skew)
    assert isinstance(e.kind, Kind)
    assert e.uniq_key
    if e.kind == Kind.DEAD:
        assert e.reason and e.reason.strip()
    if e.kind in (Kind.NOW, Kind.DELAY, Kind.COLD):
        assert e.real_topic and e.real_topic not in (RULES.intake_topic, RULES.dlq_topic)
        assert not e.real_topic.startswith("__")
        # Delivered headers never carry control headers through.
        out = parse_batch(_intake(append_ms, headers=headers), RULES, 1_000, 2,
                          append_ms + clock_skew)
        assert out.column("kind").to_pylist() == [e.kind.value]
        assert not set(out.column("hkeys").to_pylist()[0]) & H.CONTROL_HEADERS


@settings(max_examples=2000)
@given(append_times, st.integers(1, 4), st.lists(st.tuples(st.text(max_size=10), values),
                                                 max_size=5))
def test_level_due_time_comes_from_the_broker_append_time_only(append_ms, level, user):
    """User headers (anything not in the contract) and their values never change when a
    level message is due: only the broker's append time and the level do."""
    user = [(n, v) for n, v in user if n not in H.CONTROL_HEADERS]
    base = [(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())]
    plain = parse(base, 0, 1, append_ms, RULES, now_ms=append_ms)
    noisy = parse(user + base + user, 0, 1, append_ms, RULES, now_ms=append_ms)
    assert plain.kind != Kind.DEAD
    assert plain.due_ms == noisy.due_ms == append_ms + RULES.level_delays_ms[level - 1]
    assert plain.kind == noisy.kind


@settings(max_examples=2000)
@given(append_times, st.sampled_from(H.TIMER_HEADERS), st.integers(-2**63, 2**63 - 1),
       st.integers(-120_000, 120_000))
def test_a_timer_is_never_due_before_the_broker_received_it(append_ms, name, value, skew):
    e = parse([(H.REAL_TOPIC, b"orders"), (name, str(value).encode())], 0, 1, append_ms,
              RULES, now_ms=append_ms + skew)
    if e.kind != Kind.DEAD:
        assert e.level == TIMER_LEVEL
        assert append_ms <= e.due_ms <= append_ms + RULES.max_delay_ms


@settings(max_examples=1000)
@given(append_times, st.integers(1, 4), st.integers(-3_600_000, RULES.clock_tolerance_ms))
def test_within_the_clock_tolerance_a_level_is_never_due_before_append_plus_delay(
        append_ms, level, behind):
    """Clocks differ between hosts (DESIGN.md section 3): whether the parsing host's clock
    trails the broker's (`behind` > 0) by up to clock_tolerance or runs ahead of it by any
    amount, a level message is due at its append time plus its delay, on both of the parse's
    paths."""
    now = append_ms - behind
    e = parse([(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())], 0, 1, append_ms,
              RULES, now_ms=now)
    delay = RULES.level_delays_ms[level - 1]
    assert e.due_ms == append_ms + delay
    batch = parse_batch(_intake(append_ms, level), RULES, 1_000, 2, now)
    assert batch.column("due_ms").to_pylist() == [append_ms + delay]


@settings(max_examples=500)
@given(append_times, st.integers(1, 4), st.integers(1, 3_600_000))
def test_a_clock_behind_by_more_than_the_tolerance_moved_and_the_message_is_due_now(
        append_ms, level, beyond):
    """RocketMQ's correctDeliverTimestamp: a due time later than now + the level's delay by
    more than clock_tolerance means a clock moved; the message is due now."""
    now = append_ms - RULES.clock_tolerance_ms - beyond
    e = parse([(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())], 0, 1, append_ms,
              RULES, now_ms=now)
    assert e.due_ms == now
    assert parse_batch(_intake(append_ms, level), RULES, 1_000, 2, now).column(
        "due_ms").to_pylist() == [now]


def _intake(append_ms: int, level: int = 1, headers: list | None = None) -> pa.RecordBatch:
    """One level message appended at `append_ms` (or a record with `headers`), as Spark's Kafka
    source hands it over."""
    if headers is None:
        headers = [(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())]
    return pa.record_batch({
        "key": pa.array([None], pa.binary()), "value": pa.array([b"v"], pa.binary()),
        "ipart": pa.array([0], pa.int32()), "ioff": pa.array([1], pa.int64()),
        "append_ms": pa.array([append_ms], pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in headers]], HEADERS)})
