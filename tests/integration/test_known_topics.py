"""The real topics a job knows at its start (streaming/admin.py TopicCatalog with its memory
file): those its checkpoint's earlier runs delivered to, and the allow-list. A batch whose
topics are all known is sent by its one Spark job; until then each batch first runs an
aggregate job to look them up (`kafka_lookup` in its step timings)."""
from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient

from streaming import checkpoint as ckpt
from streaming.admin import TopicCatalog
from streaming.producer import DelayProducer
from tests.integration.test_delivery import send
from tests.support import check_deliveries, consume_all

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_the_catalog_remembers_the_topics_it_found_and_looks_them_up_again(
        kafka_bootstrap, new_topic, tmp_path, caplog):
    real = new_topic(partitions=2, max_message_bytes="500000")
    allowed = new_topic(partitions=3)
    never = f"never-created-{uuid.uuid4().hex[:8]}"
    memory = tmp_path / "topics.json"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        first = TopicCatalog(admin, memory=memory)
        assert first.seed() == {}
        assert first.partitions([real, never]) == {real: 2, never: None}
        assert json.loads(memory.read_text()) == [real]

        # A later run: the remembered topic and the allow-list, looked up before any batch; a
        # name that no longer exists leaves the memory.
        memory.write_text(json.dumps([real, never]))
        second = TopicCatalog(admin, memory=memory)
        assert second.seed({allowed}) == {real: 2, allowed: 3}
        assert second.max_message_bytes(real) == 500000
        assert json.loads(memory.read_text()) == sorted([real, allowed])

        # A damaged memory is a cache lost, not an error.
        memory.write_text("{not json")
        assert TopicCatalog(admin, memory=memory).seed() == {}
        assert json.loads(memory.read_text()) == []

        # A memory that cannot be written: a warning, and the catalog works on.
        with caplog.at_level(logging.WARNING, logger="streaming.admin"):
            unwritable = TopicCatalog(admin, memory=memory / "under-a-file.json")
            assert unwritable.seed({real}) == {real: 2}
            assert unwritable.partitions([allowed]) == {allowed: 3}
        assert caplog.text.count("could not keep the real topics found in") == 2
    finally:
        admin.close()


def test_a_restarted_job_knows_its_real_topics_and_sends_each_batch_in_one_job(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    settings = job_settings()
    real = new_topic(partitions=1, **LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-known-{uuid.uuid4().hex[:8]}")
    runs: list[list] = [[], []]
    sent: dict = {}

    job = start_job(settings, checkpoint=checkpoint, on_batch=runs[0].append)
    with DelayProducer(settings) as producer:
        send(producer, sent, real, b"before the restart", level=1)
    check_deliveries(consume_all(kafka_bootstrap, real, expected=1, timeout_s=60, idle_s=1), sent)
    job.stop()
    assert json.loads((Path(checkpoint) / ckpt.TOPICS_FILE).read_text()) == [real]

    start_job(settings, checkpoint=checkpoint, on_batch=runs[1].append)
    with DelayProducer(settings) as producer:
        send(producer, sent, real, b"after the restart", level=1)
    check_deliveries(consume_all(kafka_bootstrap, real, expected=2, timeout_s=60, idle_s=1), sent)
    time.sleep(1)   # the delivering batch's summary

    def looked_up(summaries) -> list[int]:
        return [s.batch_id for s in summaries if "kafka_lookup" in s.timings]
    # The first run's batches looked the topic up until its delivery found it.
    assert looked_up(runs[0]) and looked_up(runs[0])[0] == runs[0][0].batch_id
    assert runs[1], "the restarted run reported no batch"
    assert any(s.count("deliver") for s in runs[1]), "the delivery was not in a reported batch"
    assert looked_up(runs[1]) == [], "a batch of the restarted run looked its topics up again"


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
