"""Topic administration (streaming/kafka/admin.py): look-ups of a topic's partitions, and the
intake's partitions."""
from __future__ import annotations

import uuid

from kafka import KafkaAdminClient

from streaming.kafka.admin import topic_partitions


def test_topic_partitions_are_looked_up_in_one_request_and_a_missing_topic_is_none(
        kafka_bootstrap, new_topic):
    real = new_topic(partitions=2)
    never = f"never-created-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert topic_partitions(admin, [real, never]) == {real: 2, never: None}
        assert topic_partitions(admin, [never]) == {never: None}
    finally:
        admin.close()


def test_an_intake_gets_a_partition_for_the_heartbeats_after_the_levels(kafka_bootstrap,
                                                                        job_settings):
    """A new intake has one partition per level and the heartbeats'; an intake an earlier
    version made with one per level gets the heartbeats' added, and one with more keeps its."""
    from kafka.admin import NewTopic

    from streaming.kafka.admin import ensure_topics

    settings = job_settings()   # three levels
    assert settings.heartbeat_partition == 3
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        ensure_topics(settings)
        assert len(admin.describe_topics([settings.intake_topic])[0]["partitions"]) == 4
        older = job_settings()
        admin.create_topics([NewTopic(older.intake_topic, 3, 1)])
        ensure_topics(older)
        assert len(admin.describe_topics([older.intake_topic])[0]["partitions"]) == 4
        wider = job_settings()
        admin.create_topics([NewTopic(wider.intake_topic, 6, 1)])
        ensure_topics(wider)
        assert len(admin.describe_topics([wider.intake_topic])[0]["partitions"]) == 6
    finally:
        admin.close()


def test_a_ledger_topic_without_log_append_time_is_refused_with_the_fix_and_its_limit_read(
        kafka_bootstrap, job_settings):
    """The dispatch tasks measure their clocks by the ledger topic's LogAppendTime: one that
    exists with CreateTime stops the start with the command that fixes it (delayq alters no
    topic it finds); an existing one's max.message.bytes bounds the tasks' ledger records."""
    import pytest
    from kafka.admin import NewTopic

    from state.errors import JobError
    from streaming.kafka.admin import ensure_dispatch_topics, topic_config

    created, stamped = job_settings(), job_settings()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(created.ledger_topic, created.ready_partitions, 1,
                                      topic_configs={"message.timestamp.type": "CreateTime"}),
                             NewTopic(stamped.ledger_topic, stamped.ready_partitions, 1,
                                      topic_configs={"message.timestamp.type": "LogAppendTime",
                                                     "max.message.bytes": "500000"})])
        with pytest.raises(JobError) as refused:
            ensure_dispatch_topics(created, admin, 1_048_576)
        said = str(refused.value)
        assert f"topic {created.ledger_topic} has message.timestamp.type=CreateTime" in said
        assert said.endswith(f"Fix: kafka-configs.sh --alter --entity-type topics --entity-name "
                             f"{created.ledger_topic} --add-config "
                             f"message.timestamp.type=LogAppendTime")
        assert topic_config(admin, created.ledger_topic, "message.timestamp.type") \
            == "CreateTime", "left as it was"
        assert ensure_dispatch_topics(stamped, admin, 1_048_576) \
            == (stamped.ready_partitions, 500_000)
    finally:
        admin.close()


def test_a_topic_the_broker_will_not_create_stops_the_start_with_one_line(
        kafka_bootstrap, job_settings, new_topic):
    """The dead-letter topic's name collides with an existing topic's (Kafka refuses topics
    that differ only in '.' and '_'): the start says which topic, where and what to check,
    in one line, not with the client's traceback."""
    import pytest

    from state.errors import JobError
    from streaming.kafka.admin import ensure_topics

    settings = job_settings()
    new_topic(name=settings.dlq_topic.replace(".", "_"))
    with pytest.raises(JobError) as refused:
        ensure_topics(settings)
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"topic {settings.dlq_topic} could not be created on Kafka at "
                           f"{kafka_bootstrap}: ")
    assert "Check that the brokers are up" in said
