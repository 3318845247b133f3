"""The intake is the wheel's commit log (DESIGN.md section 4): its retention is part of the
guarantee. A start refuses an intake that may delete a pending message's record too soon; a
record deleted all the same under a pending reference is dead-lettered with its reason, and
the job goes on."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient

from state.errors import JobError
from streaming.kafka.admin import check_intake, ensure_topics, topic_config
from streaming.producer import DelayProducer
from streaming.wheel.query import pending_by_level
from tests.integration.conftest import Sent
from tests.support import assert_eventually, check_deliveries, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_records_deleted_under_pending_references_are_dead_lettered_and_the_job_goes_on(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir, spark):
    """Timers held in the wheel as references lose their intake records (the log's start moved
    past them, as retention moves it): each is dead-lettered as intake_record_gone when its
    dispatch task finds it gone, with its UNIQ_KEY and due time; timers sent after them are
    delivered whole."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-retention-{settings.intake_topic}")
    start_job(settings, checkpoint=checkpoint)
    due = int(time.time() * 1000) + 25_000
    with DelayProducer(settings) as producer:
        doomed = [producer.send(real, b"doomed %d" % i, deliver_at_ms=due) for i in range(8)]
    assert_eventually(lambda: sum(pending_by_level(spark, checkpoint).values()) >= 8,
                      timeout_s=60, message="the timers held in the state")
    ends: dict[int, int] = {}
    for handle in doomed:
        ends[handle.partition] = max(ends.get(handle.partition, 0), handle.offset + 1)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})   # kept: it runs the request
    deleted = admin.delete_records(
        [TopicPartition(settings.intake_topic, p, end) for p, end in ends.items()])
    for future in deleted.values():
        future.result(30)

    sent: dict = {}
    with DelayProducer(settings) as producer:
        for i in range(6):
            handle = producer.send(real, b"kept %d" % i, key=b"k", deliver_at_ms=due + 2_000,
                                   headers=[("n", b"%d" % i)])
            sent[handle.uniq_key] = Sent(b"k", b"kept %d" % i, [("n", b"%d" % i)], handle.due_ms)
    dead = consume_all(kafka_bootstrap, settings.dlq_topic, expected=len(doomed), timeout_s=90)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in dead) \
        == sorted(h.uniq_key for h in doomed)
    for record in dead:
        headers = header_map(record)
        assert headers["DLQ_REASON"].decode().startswith("intake_record_gone: "), headers
        assert int(headers["DELIVER_MS"]) == due and record.value is None


@pytest.mark.parametrize("config, said", [
    ({"cleanup.policy": "compact"}, "cleanup.policy=compact"),
    ({"retention.ms": "3600000"}, "retention.ms=3600000"),
    ({"retention.bytes": "1073741824"}, "retention.bytes=1073741824"),
], ids=["compacted", "short", "bounded"])
def test_an_intake_that_may_delete_a_pending_record_too_soon_is_refused(
        job_settings, new_topic, kafka_bootstrap, config, said):
    settings = job_settings()
    new_topic(name=settings.intake_topic, partitions=4, **LOG_APPEND,
              **{k.replace(".", "_"): v for k, v in config.items()})
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        with pytest.raises(JobError) as refused:
            check_intake(settings, admin)
        assert said in str(refused.value) and "kafka-configs.sh --alter" in str(refused.value)
        assert "\n" not in str(refused.value)
    finally:
        admin.close()


def test_a_new_intake_keeps_records_long_enough_and_passes(job_settings, kafka_bootstrap):
    settings = job_settings(downtime_tolerance="8d")
    ensure_topics(settings)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert int(topic_config(admin, settings.intake_topic, "retention.ms")) \
            == settings.intake_retention_needed_ms > 8 * 86_400_000
        assert topic_config(admin, settings.intake_topic, "cleanup.policy") == "delete"
        assert check_intake(settings, admin) == settings.intake_retention_needed_ms
    finally:
        admin.close()
