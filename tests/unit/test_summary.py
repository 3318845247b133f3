import pytest

from sinks.base import BatchSummary
from state.reasons import reason_label


@pytest.mark.parametrize("reason, label", [
    ("missing_real_topic: header REAL_TOPIC is missing", "missing_real_topic"),
    ("unknown_topic: REAL_TOPIC 'x' does not exist", "unknown_topic"),
    # any other text: an older version's reason, or a text that only looks like a label
    ("header REAL_TOPIC is missing", "unknown"),
    ("REAL_TOPIC 'unknown_topic: x' does not exist", "unknown"),
    ("made_up: some text", "unknown"),
    (None, "unknown"),
])
def test_a_dead_letter_is_counted_by_the_label_its_reason_begins_with(reason, label):
    assert reason_label(reason) == label


def test_summary_counts_by_kind_level_and_reason():
    s = BatchSummary(7)
    assert not s.by_kind and not s.received_by_level
    s.add("deliver", 2, None, 5)
    s.add("deliver", 2, None, 1)
    s.add("dead", 0, "missing_real_topic: header REAL_TOPIC is missing", 3)
    assert (s.count("deliver"), s.delivered_by_level, s.dead_by_reason) == \
        (6, {2: 6}, {"missing_real_topic": 3})


def test_send_failures_are_dead_lettered_only_when_permanent():
    """The dispatch classifies a failed send by the client's error code (streaming/dispatch/rules.py)."""
    from confluent_kafka import KafkaError, KafkaException

    from streaming.dispatch.rules import Row, refusal

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
    for code, label in ((KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown_topic"),
                        (KafkaError._UNKNOWN_PARTITION, "partition_out_of_range"),
                        (KafkaError.MSG_SIZE_TOO_LARGE, "too_large"),
                        (KafkaError.RECORD_LIST_TOO_LARGE, "too_large"),
                        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "not_authorized"),
                        (KafkaError.INVALID_RECORD, "invalid_record"),
                        (KafkaError.TOPIC_EXCEPTION, "illegal_topic")):
        assert reason_label(refusal(KafkaError(code), row)) == label


def test_a_ready_write_observation_fills_the_summary_as_fired_not_delivered():
    from sinks.ready import add_counts

    s = BatchSummary(9)
    add_counts({"deliver": 4, "cold": 2, "cancelled": 1, "cancel_unknown": 0,
                "dead": ["missing_real_topic: header REAL_TOPIC is missing", "",
                         "missing_real_topic: header REAL_TOPIC is missing"],
                "tally": [{"level": 2, "received": 5, "pending_delta": 3},
                          {"level": 2, "received": 1, "pending_delta": -4}]}, s)
    assert s.by_kind == {"deliver": 4, "cold": 2, "cancelled": 1, "dead": 3}
    assert s.delivered_by_level == {}, "the ledger query counts deliveries once they are sent"
    assert s.dead_by_reason == {"missing_real_topic": 2, "unknown": 1}
    assert s.received_by_level == {2: 6} and s.pending_delta_by_level == {2: -1}
