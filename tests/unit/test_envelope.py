"""Header rules of the wire contract (DESIGN.md section 2) and the time rules (section 3)."""
import pyarrow as pa
import pytest

from state.columns import HEADERS
from state.envelope import TIMER_LEVEL, Kind, Rules, parse, topic_refusal
from state.parse import parse_batch
from state.reasons import reason_label
from tests.support import KEY, rolled_header  # noqa: F401

RULES = Rules(level_delays_ms=(1_000, 5_000, 10_000), intake_topic="SCHEDULE_TOPIC_XXXX",
              dlq_topic="SCHEDULE_TOPIC_XXXX.DLQ", allowed_topics=frozenset(),
              max_delay_ms=86_400_000, clock_tolerance_ms=60_000, near_horizon_ms=600_000,
              cold_bucket_ms=3_600_000, timer_parts=8, ring_horizon_ms=0,
              rolls_to_ring=False, seal_key=KEY,
              legacy_before=())
APPEND = 1_700_000_000_000


def env(*headers, rules=RULES, now=APPEND + 5):
    return parse([(k, v) for k, v in headers], partition=2, offset=41, append_ms=APPEND,
                 rules=rules, now_ms=now)


def delivered_headers(*headers, rules=RULES):
    """The headers the parse stage passes on with one intake record (its batch path)."""
    batch = pa.record_batch({
        "key": pa.array([None], pa.binary()), "value": pa.array([b"v"], pa.binary()),
        "ipart": pa.array([2], pa.int32()), "ioff": pa.array([41], pa.int64()),
        "append_ms": pa.array([APPEND], pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in headers]], HEADERS)})
    out = parse_batch(batch, rules, 1_000, 2, APPEND + 5).to_pylist()[0]
    return list(zip(out["hkeys"], out["hvals"]))


def test_level_message_is_delayed_by_its_level_from_append_time():
    e = env(("REAL_TOPIC", b"orders"), ("DELAY", b"2"), ("UNIQ_KEY", b"abc"))
    assert (e.kind, e.real_topic, e.level, e.due_ms, e.uniq_key) == \
        (Kind.DELAY, "orders", 2, APPEND + 5_000, "abc")


def test_level_zero_and_no_delay_header_are_immediate():
    assert env(("REAL_TOPIC", b"t"), ("DELAY", b"0")).kind == Kind.NOW
    now = env(("REAL_TOPIC", b"t"))
    assert (now.kind, now.due_ms) == (Kind.NOW, APPEND)


def test_level_above_maximum_is_clamped():
    e = env(("REAL_TOPIC", b"t"), ("DELAY", b"99"))
    assert (e.level, e.due_ms) == (3, APPEND + 10_000)


def test_missing_uniq_key_is_partition_dash_offset():
    assert env(("REAL_TOPIC", b"t"), ("DELAY", b"1")).uniq_key == "2-41"


def test_user_headers_keep_order_and_duplicates_and_control_headers_go():
    headers = (("a", b"1"), ("REAL_TOPIC", b"t"), ("b", b"\xff"), ("DELAY", b"1"), ("a", b"2"),
               ("REAL_QID", b"3"), ("n", None))
    assert delivered_headers(*headers) == [("a", b"1"), ("b", b"\xff"), ("a", b"2"), ("n", None)]
    assert env(*headers).real_qid == 3


@pytest.mark.parametrize("headers, reason, label", [
    ([("DELAY", b"1")], "REAL_TOPIC is missing", "missing_real_topic"),
    ([("REAL_TOPIC", b"")], "not a legal Kafka topic name", "illegal_topic"),
    ([("REAL_TOPIC", b"bad topic")], "not a legal Kafka topic name", "illegal_topic"),
    ([("REAL_TOPIC", b"\xff")], "REAL_TOPIC is not valid UTF-8", "not_utf8"),
    ([("REAL_TOPIC", None)], "REAL_TOPIC has no value", "no_value"),
    ([("REAL_TOPIC", b"SCHEDULE_TOPIC_XXXX")], "is the intake topic", "topic_not_allowed"),
    ([("REAL_TOPIC", b"SCHEDULE_TOPIC_XXXX.DLQ")], "is the dead-letter topic", "topic_not_allowed"),
    ([("REAL_TOPIC", b"__consumer_offsets")], "internal Kafka topic", "topic_not_allowed"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"x1")], "DELAY='x1' is not an integer", "not_an_integer"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"1.5")], "is not an integer", "not_an_integer"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"-2")], "DELAY=-2 is negative", "negative"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"\xc3")], "DELAY is not valid UTF-8", "not_utf8"),
    ([("REAL_TOPIC", b"t"), ("REAL_QID", b"q")], "REAL_QID='q' is not an integer", "not_an_integer"),
    ([("REAL_TOPIC", b"t"), ("REAL_QID", b"-1")], "REAL_QID=-1 is not a partition", "not_a_partition"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("TIMER_DELAY_MS", b"5")], "more than one delay header", "several_delay_headers"),
    ([("REAL_TOPIC", b"t"), ("DELAY", b"1"), ("DELAY", b"2")], "DELAY appears twice", "duplicate_header"),
    ([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"")], "UNIQ_KEY is empty", "empty_header"),
    ([("REAL_TOPIC", b"t"), ("TIMER_DELAY_SEC", b"90000")], "beyond the maximum delay", "beyond_max_delay"),
    ([("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(APPEND - 3_600_000).encode())], "in the past", "timer_in_past"),
    ([("REAL_TOPIC", b"t"), ("TIMER_DELAY_MS", b"-5")], "negative", "negative"),
    ([("REAL_TOPIC", b"t"), ("TIMER_DELAY_MS", b"soon")], "not an integer", "not_an_integer"),
    # A cancel placed by its level and due time (found by the property test as a ValueError).
    ([("TIMER_DEL_UNIQKEY", b"k"), ("DELAY", b"-1"), ("TIMER_DELIVER_MS", b"5")],
     "DELAY=-1 is negative", "negative"),
])
def test_bad_input_is_dead_with_a_reason_and_its_label(headers, reason, label):
    e = env(*headers)
    assert e.kind == Kind.DEAD
    assert reason in e.reason
    assert e.reason.startswith(f"{label}: ") and reason_label(e.reason) == label


def test_allow_list():
    rules = Rules(**{**RULES.__dict__, "allowed_topics": frozenset({"orders"})})
    assert env(("REAL_TOPIC", b"orders"), rules=rules).kind == Kind.NOW
    assert "allow-list" in env(("REAL_TOPIC", b"other"), rules=rules).reason
    assert topic_refusal("orders", rules) is None


def test_timers_absolute_relative_and_in_the_past():
    at = env(("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(APPEND + 7_777).encode()))
    assert (at.kind, at.level, at.due_ms) == (Kind.DELAY, TIMER_LEVEL, APPEND + 7_777)
    rel = env(("REAL_TOPIC", b"t"), ("TIMER_DELAY_SEC", b"3"))
    assert rel.due_ms == APPEND + 3_000
    past = env(("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(APPEND - 10_000).encode()))
    assert (past.kind, past.due_ms) == (Kind.NOW, APPEND)


def test_correct_deliver_timestamp_allows_the_clock_tolerance():
    # The broker's clock runs a second ahead of ours (RULES: tolerance 60 s): the due time
    # stands; an hour ahead, beyond the tolerance, a clock moved: deliver now.
    e = env(("REAL_TOPIC", b"t"), ("DELAY", b"1"), now=APPEND - 1_000)
    assert (e.kind, e.due_ms) == (Kind.DELAY, APPEND + 1_000)
    e = env(("REAL_TOPIC", b"t"), ("DELAY", b"1"), now=APPEND - 3_600_000)
    assert e.due_ms == APPEND - 3_600_000
    assert e.kind == Kind.NOW


def test_heartbeat_and_cancel():
    assert env(("DELAYQ_HEARTBEAT", b"1")).kind == Kind.HEARTBEAT
    c = env(("TIMER_DEL_UNIQKEY", b"abc"), ("DELAY", b"1"))
    assert (c.kind, c.cancel_key, c.level) == (Kind.CANCEL, "abc", 1)


def test_dead_letter_keeps_uniq_key_when_readable():
    assert env(("UNIQ_KEY", b"id-7"), ("DELAY", b"1")).uniq_key == "id-7"


def test_cancel_of_a_level_message_is_placed_by_its_level_and_due_time():
    c = env(("TIMER_DEL_UNIQKEY", b"abc"), ("DELAY", b"2"), ("TIMER_DELIVER_MS", b"1700000009999"))
    assert (c.kind, c.level, c.due_ms, c.cancel_key) == (Kind.CANCEL, 2, 1_700_000_009_999, "abc")


def test_cancel_of_a_timer_is_placed_by_its_deliver_time():
    c = env(("TIMER_DEL_UNIQKEY", b"t1"), ("TIMER_DELIVER_MS", b"1700000500000"))
    assert (c.kind, c.level, c.due_ms) == (Kind.CANCEL, TIMER_LEVEL, 1_700_000_500_000)


def test_a_message_with_two_delay_headers_is_still_refused():
    assert env(("REAL_TOPIC", b"t"), ("DELAY", b"2"), ("TIMER_DELIVER_MS", b"1")).kind == Kind.DEAD


COLD_RULES = Rules(**{**RULES.__dict__, "near_horizon_ms": 600_000, "cold_bucket_ms": 3_600_000})


def test_far_messages_go_cold_only_when_their_whole_bucket_is_beyond_the_horizon():
    hour = 3_600_000
    base = APPEND - APPEND % hour                 # the hour APPEND falls in
    far = env(("REAL_TOPIC", b"t"), ("TIMER_DELIVER_MS", str(base + 3 * hour + 5).encode()),
              rules=COLD_RULES)
    assert far.kind == Kind.COLD and far.due_ms == base + 3 * hour + 5
    # Due in 20 minutes, but its bucket (this hour or the next) starts within 10 minutes or
    # already started: the wheel keeps it.
    near = env(("REAL_TOPIC", b"t"), ("TIMER_DELAY_MS", str(20 * 60_000).encode()),
               rules=COLD_RULES)
    bucket = (APPEND + 20 * 60_000) - (APPEND + 20 * 60_000) % hour
    assert near.kind == (Kind.COLD if bucket > APPEND + 600_000 else Kind.DELAY)


def test_rolled_messages_come_back_to_their_level_with_their_due_time():
    headers = (("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"u1"),
               ("TIMER_DELIVER_MS", str(APPEND + 9_000).encode()),
               rolled_header(3, APPEND + 9_000, "u1", "t"),
               ("trace", b"x"))
    rolled = env(*headers, rules=COLD_RULES)
    assert (rolled.kind, rolled.level, rolled.due_ms, rolled.uniq_key, rolled.rolled) == \
        (Kind.DELAY, 3, APPEND + 9_000, "u1", True)
    assert delivered_headers(*headers, rules=COLD_RULES) == [("trace", b"x")]
