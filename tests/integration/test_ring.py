"""Each dispatch task's own timer wheel (streaming/dispatch/ring.py) on the real broker and real
Spark: the tests' rings are 6 slots of 2 s, so timers due 1 s to 8 s after their append go
through them (1 s: the direct window; beyond 8 s: the wheel)."""
from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaProducer

from state import headers as H
from streaming.producer import DelayProducer
from tests.integration.conftest import Sent
from tests.integration.test_dispatch import ledger_of
from tests.support import check_deliveries, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_scattered_timers_go_through_the_ring_once_on_time_and_in_due_order(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log):
    """300 timers due 1.2 to 7.8 s after their append, every header form, all on one intake
    partition (one task): each written once to the ring (a `ringed` ledger row), read back from
    it (its delivered row names its ring partition and offset), delivered once, never early,
    within 2 s of its due time, and in due order."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent, appended = {}, {}
    forms = (H.TIMER_DELAY_MS, H.TIMER_DELAY_SEC, H.TIMER_DELIVER_MS)
    for i in range(300):
        delay = 1_200 + (i * 2_207) % 6_600
        name = forms[i % 3]
        value = {H.TIMER_DELAY_MS: delay, H.TIMER_DELAY_SEC: max(2, delay // 1000),
                 H.TIMER_DELIVER_MS: int(time.time() * 1000) + delay}[name]
        uniq = f"ring-{i}"
        meta = producer.send(settings.intake_topic, f"v{i}".encode(), partition=0, headers=[
            (H.REAL_TOPIC, real.encode()), (name, str(value).encode()),
            (H.UNIQ_KEY, uniq.encode())]).get(timeout=30)
        due = (meta.timestamp + value * 1000 if name == H.TIMER_DELAY_SEC else
               max(meta.timestamp, value) if name == H.TIMER_DELIVER_MS else meta.timestamp + value)
        sent[uniq] = Sent(None, f"v{i}".encode(), [], due)
        appended[uniq] = meta.timestamp
    producer.close()
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=3)
    late: list[int] = []
    check_deliveries(records, sent, lateness_log=late)
    lateness_log.extend(late)
    assert max(late) < 2_000, f"late by up to {max(late)} ms"
    dues = [int(header_map(r)[H.DELIVER_MS]) for r in records]   # one real partition
    assert dues == sorted(dues), "in due order"
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, 2 * len(sent))
    ringed = {r["uniq_key"] for r in rows if r["status"] == "ringed"}
    from_ring = {r["uniq_key"] for r in rows if r["status"] == "delivered"
                 and r["ring_offset"] is not None}
    # Those due before the ring's next slot but one when read are held at once (slots of 2 s,
    # read 1 s ahead); the rest went to the ring.
    far = {u for u, s in sent.items() if s.due_ms - appended[u] >= 5_000}
    assert ringed == from_ring and far <= ringed and len(far) > 100, (len(ringed), len(far))
    assert len([r for r in rows if r["status"] == "ringed"]) == len(ringed), "each ringed once"


def test_a_cancel_drops_a_timer_in_the_ring_and_a_late_one_misses(
        job_settings, start_job, new_topic, kafka_bootstrap, spark):
    """A timer due 7 s out, in the ring, cancelled once it is there, never arrives; its
    neighbour does; `delayq ledger` says cancelled, and pending in the ring before it was due.
    A cancel after its timer was delivered is counted as a miss."""
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from sinks.metrics import Metrics
    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables
    from tests.support import assert_eventually

    settings = job_settings(ring_slots=12)   # 20 s: time for a look-up before `kept` is due
    real = new_topic(**LOG_APPEND)
    metrics = Metrics(CollectorRegistry(), version="test", spark_version="test")
    job = start_job(settings, metrics=metrics)
    with DelayProducer(settings) as producer:
        target = producer.send(real, b"cancelled", delay_ms=7_000)
        kept = producer.send(real, b"kept", delay_ms=18_000)
        early = producer.send(real, b"early", delay_ms=2_500)
        producer.cancel(target)
        tables = Tables(lambda: spark)
        where = lookup.find(tables, settings, kept.uniq_key, Path(job.checkpoint))
        assert (where.status, where.detail.get("where")) == ("pending", "the dispatch task's ring")
        consume_all(kafka_bootstrap, real, expected=1, timeout_s=30,
                    done=lambda got: any(r.value == b"early" for r in got))
        producer.cancel(early)   # too late
    records = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60, idle_s=3)
    check_deliveries(records, {h.uniq_key: Sent(None, v, [], h.due_ms)
                               for h, v in ((kept, b"kept"), (early, b"early"))})
    assert_eventually(lambda: lookup.find(tables, settings, target.uniq_key,
                                          Path(job.checkpoint)).status == "cancelled",
                      timeout_s=60, message="the ledger says cancelled")
    misses = lambda: metrics.registry.get_sample_value("delayq_cancel_misses_total")  # noqa
    assert_eventually(lambda: misses() == 1, timeout_s=60, message="the late cancel a miss")
    assert metrics.registry.get_sample_value("delayq_messages_cancelled_total") == 1


def test_the_job_down_longer_than_the_ring_sends_every_overdue_timer_once_in_due_order(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Timers written to the ring, then the job stopped for longer than the ring's turn (12 s)
    and started again: every overdue timer leaves once, in due order, soon after the start."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-ring-{uuid.uuid4().hex[:8]}")
    job = start_job(settings, checkpoint=checkpoint)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = {}
    for i in range(120):
        meta = producer.send(settings.intake_topic, f"v{i}".encode(), partition=0, headers=[
            (H.REAL_TOPIC, real.encode()), (H.TIMER_DELAY_MS, str(3_000 + 37 * i).encode()),
            (H.UNIQ_KEY, f"down-{i}".encode())]).get(timeout=30)
        sent[f"down-{i}"] = Sent(None, f"v{i}".encode(), [], meta.timestamp + 3_000 + 37 * i)
    producer.close()
    ledger_of(kafka_bootstrap, settings.ledger_topic, len(sent))   # all ringed
    job.stop()
    time.sleep(14)
    start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=3)
    check_deliveries(records, sent, late_ms=10_000, after_ms=up_ms)
    dues = [int(header_map(r)[H.DELIVER_MS]) for r in records]
    assert dues == sorted(dues), "overdue ones in due order"
    assert max(r.timestamp for r in records) - up_ms < 10_000


def test_a_ring_partition_past_its_retention_is_refused_at_start(job_settings, kafka_bootstrap):
    """The dispatch group's position in a ring partition below the log's start (retention
    deleted timers not yet read): the start is refused, naming the partition and the fix."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import NewTopic
    from kafka.structs import OffsetAndMetadata

    from state.errors import JobError
    from streaming.kafka.admin import check_ring_positions

    settings = job_settings()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(settings.ring_topic, 12, 1)])
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(10):
        producer.send(settings.ring_topic, b"x", partition=3)
    producer.flush()
    group = f"delayq.{settings.intake_topic}.dispatch"
    admin.alter_group_offsets(group, {TopicPartition(settings.ring_topic, 3):
                                      OffsetAndMetadata(2, "", -1)})
    admin.delete_records({TopicPartition(settings.ring_topic, 3): 6})
    with pytest.raises(JobError, match=r"3: committed 2, log starts at 6.*reset-offsets"):
        check_ring_positions(settings, admin)
    admin.close()
