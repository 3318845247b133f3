"""Topic administration (streaming/admin.py): look-ups of a topic's partitions, and the
intake's partitions."""
from __future__ import annotations

import uuid

from kafka import KafkaAdminClient

from streaming.admin import topic_partitions


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

    from streaming.admin import ensure_topics

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
