import pytest

from sinks.base import BatchSummary, reason_label
from sinks.kafka import KafkaSink


@pytest.mark.parametrize("reason, label", [
    ("header REAL_TOPIC is missing", "missing_real_topic"),
    ("REAL_TOPIC 'x' does not exist", "unknown_topic"),
    ("REAL_QID 7 is out of range: topic 'x' has 3 partitions", "partition_out_of_range"),
    ("REAL_TOPIC 'a b' is not a legal Kafka topic name", "illegal_topic"),
    ("REAL_TOPIC 'SCHEDULE_TOPIC_XXXX' is the intake topic", "topic_not_allowed"),
    ("REAL_TOPIC '__consumer_offsets' is an internal Kafka topic", "topic_not_allowed"),
    ("header DELAY is not valid UTF-8", "not_utf8"),
    ("header DELAY='x' is not an integer", "not_an_integer"),
    ("header DELAY=-1 is negative", "negative"),
    ("more than one delay header: DELAY, TIMER_DELAY_MS", "several_delay_headers"),
    ("header TIMER_DELAY_SEC=99999999 is beyond the maximum delay of 2592000 s (setting max_delay)", "beyond_max_delay"),
    (None, "unknown"),
])
def test_dead_letter_reasons_have_low_cardinality_labels(reason, label):
    assert reason_label(reason) == label


def test_summary_counts_by_kind_level_and_reason():
    s = BatchSummary(7)
    assert s.empty
    s.add("deliver", 2, None, 5)
    s.add("deliver", 2, None, 1)
    s.add("dead", 0, "header REAL_TOPIC is missing", 3)
    assert (s.count("deliver"), s.delivered_by_level, s.dead_by_reason) == \
        (6, {2: 6}, {"missing_real_topic": 3})


def test_refusal_rule():
    sizes = {"a": 3, "gone": None}
    assert KafkaSink.refusal("a", 2, sizes) is None
    assert KafkaSink.refusal("a", None, sizes) is None
    assert "out of range" in KafkaSink.refusal("a", 3, sizes)
    assert "does not exist" in KafkaSink.refusal("gone", None, sizes)
