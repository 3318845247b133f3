import pytest

from sinks.base import BatchSummary, reason_label


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


def test_send_failures_are_dead_lettered_only_when_permanent():
    """The dispatch classifies a failed send by the client's error code (sinks/dispatch.py)."""
    from confluent_kafka import KafkaError, KafkaException

    from sinks.dispatch import Row, refusal

    row = Row(0, 0, 0, 0, "orders", 7, b"k", b"vv", [("h", b"x")], 1, 0, "u")
    assert "does not exist" in refusal(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), row)
    assert "does not exist" in refusal(KafkaError(KafkaError._UNKNOWN_TOPIC), row)
    assert "REAL_QID 7 is out of range" in refusal(KafkaError(KafkaError._UNKNOWN_PARTITION), row)
    assert "message of 5 bytes is too large" in refusal(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), row)
    assert "not authorized" in refusal(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), row)
    for transient in (KafkaError._MSG_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
                      KafkaError._TRANSPORT, KafkaError.REQUEST_TIMED_OUT):
        assert refusal(KafkaError(transient), row) is None
    with pytest.raises(KafkaException):
        refusal(KafkaError(KafkaError._FATAL, fatal=True), row)
    for reason, label in (("REAL_TOPIC 'x' does not exist", "unknown_topic"),
                          ("REAL_QID 7 is out of range for topic 'x'", "partition_out_of_range"),
                          ("message of 5 bytes is too large for topic 'x'", "too_large"),
                          ("not authorized to write to topic 'x'", "not_authorized")):
        assert reason_label(reason) == label


def test_a_ready_write_observation_fills_the_summary_as_fired_not_delivered():
    from sinks.ready import add_counts

    s = BatchSummary(9)
    add_counts({"deliver": 4, "cold": 2, "cancelled": 1, "cancel_unknown": 0,
                "dead": ["header REAL_TOPIC is missing", "", "header REAL_TOPIC is missing"],
                "tally": [{"level": 2, "received": 5, "pending_delta": 3},
                          {"level": 2, "received": 1, "pending_delta": -4}]}, s)
    assert s.by_kind == {"deliver": 4, "cold": 2, "cancelled": 1, "dead": 3}
    assert s.delivered_by_level == {}, "the ledger query counts deliveries once they are sent"
    assert s.dead_by_reason == {"missing_real_topic": 2, "unknown": 1}
    assert s.received_by_level == {2: 6} and s.pending_delta_by_level == {2: -1}
