"""Each dispatch task's own timer wheel (streaming/dispatch/ring.py) on the real broker and real
Spark: the tests' rings are 6 slots of 2 s, so timers due 1 s to 8 s after their append go
through them (1 s: the direct window; beyond 8 s: the wheel). Kills at chosen moments run the
task alone, in a process of its own, on the real broker."""
from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from dataclasses import replace

import pytest
from kafka import KafkaProducer

from conf import load_settings
from state import headers as H
from streaming.stages import ring_of, rules_of
from streaming.producer import DelayProducer
from tests.integration.conftest import Sent
from tests.integration.test_dispatch import (_run, dispatch, in_thread,  # noqa: F401
                                             ledger_of, stop, transactional)
from tests.support import assert_eventually, check_deliveries, consume_all, header_map

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
    # Each delivered row is in the transaction that sent its message: all are there by now.
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, len(sent), status="delivered")
    ringed = {r["uniq_key"] for r in rows if r["status"] == "ringed"}
    from_ring = {r["uniq_key"] for r in rows if r["status"] == "delivered"
                 and r["ring_offset"] is not None}
    # Those due before the ring's next slot but one when read are held at once (slots of 2 s,
    # read 1 s ahead: due within 3 to 5 s of their read); the rest went to the ring. A loaded
    # host reads a record up to some hundreds of ms after its append: 1 s is allowed for it.
    far = {u for u, s in sent.items() if s.due_ms - appended[u] >= 6_000}
    assert ringed == from_ring, "each ringed timer read from the ring"
    assert far <= ringed and len(far) > 75, (len(ringed), len(far - ringed))
    assert len([r for r in rows if r["status"] == "ringed"]) == len(ringed), "each ringed once"


def test_a_cancel_drops_a_timer_in_the_ring_and_a_late_one_misses(
        job_settings, start_job, new_topic, kafka_bootstrap, spark):
    """A timer due 12 s out, cancelled once `delayq ledger` finds it in the ring, never arrives;
    its neighbour does; `delayq ledger` then says cancelled. While they wait there the pending
    gauge counts them as timers (level -1) and the ring's lag gauge reads on time. A cancel after
    its timer was delivered is counted as a miss."""
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from sinks.metrics import Metrics
    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables
    from tests.support import assert_eventually

    settings = job_settings(ring_slots=12)   # a horizon of 20 s: time to find them there
    real = new_topic(**LOG_APPEND)
    metrics = Metrics(CollectorRegistry(), version="test", spark_version="test")
    job = start_job(settings, metrics=metrics)
    sample = metrics.registry.get_sample_value
    with DelayProducer(settings) as producer:
        target = producer.send(real, b"cancelled", delay_ms=12_000)
        kept = producer.send(real, b"kept", delay_ms=18_000)
        early = producer.send(real, b"early", delay_ms=2_500)
        tables = Tables(lambda: spark)
        where = lambda h: lookup.find(tables, settings, h.uniq_key, Path(job.checkpoint))  # noqa
        for handle in (target, kept):
            assert_eventually(lambda: where(handle).detail.get("where") ==
                              "the dispatch task's ring", timeout_s=8, message="in the ring")
        assert where(target).status == "pending"
        producer.cancel(target)
        assert_eventually(lambda: sample("delayq_pending_messages", {"level": "-1"}) >= 1,
                          timeout_s=10, message="the ringed timers counted pending")
        lags = [s.value for family in metrics.registry.collect()
                if family.name == "delayq_ring_lag_seconds" for s in family.samples]
        assert lags and max(lags) < 2, f"each task's next slot read on time: {lags}"
        consume_all(kafka_bootstrap, real, expected=1, timeout_s=30,
                    done=lambda got: any(r.value == b"early" for r in got))
        producer.cancel(early)   # too late
    records = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60, idle_s=3)
    check_deliveries(records, {h.uniq_key: Sent(None, v, [], h.due_ms)
                               for h, v in ((kept, b"kept"), (early, b"early"))})
    assert_eventually(lambda: where(target).status == "cancelled",
                      timeout_s=60, message="the ledger says cancelled")
    misses = lambda: sample("delayq_cancel_misses_total")  # noqa
    assert_eventually(lambda: misses() == 1, timeout_s=60, message="the late cancel a miss")
    # Counted by the ledger query's batch (ledger_interval), not when the ledger row is written.
    assert_eventually(lambda: sample("delayq_messages_cancelled_total") == 1, timeout_s=30,
                      message="one counted cancelled")


def test_the_job_down_longer_than_the_ring_sends_every_overdue_timer_once_in_due_order(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Timers due 8 to 11.6 s after their append, all written to the ring (a ring of 8 slots of
    2 s: a horizon of 12 s, a turn of 16 s), then the job stopped for longer than a turn and
    started again: every overdue timer leaves once, read from the ring, in due order, soon after
    the start."""
    settings = job_settings(ring_slots=8)
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-ring-{uuid.uuid4().hex[:8]}")
    job = start_job(settings, checkpoint=checkpoint)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = {}
    for i in range(120):
        meta = producer.send(settings.intake_topic, f"v{i}".encode(), partition=0, headers=[
            (H.REAL_TOPIC, real.encode()), (H.TIMER_DELAY_MS, str(8_000 + 30 * i).encode()),
            (H.UNIQ_KEY, f"down-{i}".encode())]).get(timeout=30)
        sent[f"down-{i}"] = Sent(None, f"v{i}".encode(), [], meta.timestamp + 8_000 + 30 * i)
    producer.close()
    ringed = ledger_of(kafka_bootstrap, settings.ledger_topic, len(sent), status="ringed")
    assert sorted(r["uniq_key"] for r in ringed if r["status"] == "ringed") == sorted(sent)
    job.stop()
    assert not consume_all(kafka_bootstrap, real, expected=0, idle_s=1), "none sent yet"
    time.sleep(18)
    start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=3)
    check_deliveries(records, sent, late_ms=10_000, after_ms=up_ms)
    dues = [int(header_map(r)[H.DELIVER_MS]) for r in records]
    assert dues == sorted(dues), "overdue ones in due order"
    assert max(r.timestamp for r in records) - up_ms < 10_000
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, len(sent), status="delivered")
    assert all(r["ring_offset"] is not None for r in rows if r["status"] == "delivered"), \
        "each read from the ring"


def test_a_ring_partition_past_its_retention_is_refused_at_start(
        job_settings, start_job, kafka_bootstrap):
    """The dispatch group's position in a ring partition below the log's start (retention
    deleted timers not yet read): the job's start is refused, naming the partition, the numbers
    and the fix, and so is the next start: never a silent skip, never tasks that fail on it at
    every restart."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import CoordinatorNotAvailableError
    from kafka.structs import OffsetAndMetadata

    from state.errors import JobError
    from streaming.kafka import admin as kadmin

    settings = job_settings()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    largest = max(kadmin.ensure_topics(settings, admin), 1_048_576)
    tasks, _ = kadmin.ensure_dispatch_topics(settings, admin, largest)
    kadmin.ensure_ring(settings, admin, tasks, largest)   # as the job makes it
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(10):
        producer.send(settings.ring_topic, b"x", partition=3)
    producer.flush()
    producer.close()
    group = f"delayq.{settings.intake_topic}.dispatch"

    def committed_at_2() -> bool:
        try:
            admin.alter_group_offsets(group, {TopicPartition(settings.ring_topic, 3):
                                              OffsetAndMetadata(2, "", -1)})
            return True
        except CoordinatorNotAvailableError:   # a new broker's first group: it makes its topic
            return False
    assert_eventually(committed_at_2, timeout_s=30, message="the dispatch group's position")
    admin.delete_records({TopicPartition(settings.ring_topic, 3): 6})
    admin.close()
    for _ in range(2):
        with pytest.raises(JobError, match=r"\(3: committed 2, log starts at 6\)\. Raise its "
                           r"retention\.ms.*--reset-offsets --to-earliest"):
            start_job(settings)


def _ring_counts(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """The records on `topic`'s partitions, written (the high watermarks) and committed as far as
    a read_committed reader sees (its ends stop at the first open transaction)."""
    from confluent_kafka import Consumer, TopicPartition

    counts = []
    for isolation in ("read_uncommitted", "read_committed"):
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "ring-counts",
                           "isolation.level": isolation})
        counts.append(sum(reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                          for p in range(partitions)))
        reader.close()
    return counts[0], counts[1]


def _ring_task(dispatch, new_topic, **changes):
    """The `dispatch` fixture's task with a ring of 10 slots of 2 s read 1 s ahead, delivering
    exactly once (timers due over 1 s after their append go to the ring), and `changes`."""
    config, _ = dispatch
    slots = 10
    ring = new_topic(partitions=slots, **LOG_APPEND)
    settings = load_settings(intake_topic=config.intake_topic, dlq_topic=config.dlq_topic,
                             ring_slots=slots, ring_slot_ms=2_000, ring_read_lead_ms=1_000,
                             dispatch_direct_max_delay_ms=1_000)
    return transactional(replace(config, direct_max_delay_ms=1_000, rules=rules_of(settings, ""),
                                 ring=replace(ring_of(settings), topic=ring), **changes))


def _timers_in_one_slot(bootstrap: str, config, count: int, per_ms: int) -> dict[str, int]:
    """`count` timers (`per_ms` a millisecond) due from the start of the 2 s slot 10 s on, on
    intake partition 0; their due times by UNIQ_KEY."""
    slot_start = -(-(int(time.time() * 1000) + 10_000) // 2_000) * 2_000
    due = {f"t{i}": slot_start + i // per_ms for i in range(count)}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for uniq, at in due.items():
        producer.send(config.intake_topic, b"v", partition=0, headers=[
            (H.REAL_TOPIC, config.real.encode()), (H.TIMER_DELIVER_MS, str(at).encode()),
            (H.UNIQ_KEY, uniq.encode())])
    producer.flush(30)
    producer.close()
    return due


def test_a_task_killed_before_its_ring_write_commits_and_in_the_middle_of_a_slot_sends_each_once(
        dispatch, new_topic, kafka_bootstrap):
    """2,000 timers due over one 2 s slot, 10 to 14 s after their append. A first task (its
    commits 30 s apart, started before them: its first turn of the ring read) writes them to
    its ring in a transaction it has not committed, and is killed (SIGKILL); the second fences
    it, so those writes are aborted, and writes them again; holding at most 500 rows, it reads
    the slot in parts as it sends them and is killed in the middle of that read; the third reads
    the slot again from its commit point. Each timer arrives once (read_committed), through the
    ring, never early, the rest soon after the third task starts; each is ringed once in the
    ledger."""
    config = _ring_task(dispatch, new_topic)
    ring, slots = config.ring.topic, 10
    spawn = multiprocessing.get_context("spawn")
    first = spawn.Process(target=_run, args=(replace(config, commit_interval_s=30.0),))
    second = spawn.Process(target=_run, args=(replace(config, max_held=500, read_batch=100),))
    try:
        first.start()
        assert_eventually(lambda: _ring_counts(kafka_bootstrap, config.ledger_topic, 1)[0] > 0,
                          timeout_s=60, message="the first task's clock probe (it is up)")
        time.sleep(1)   # its first turn of the ring read, at once
        due = _timers_in_one_slot(kafka_bootstrap, config, 2_000, per_ms=1)
        assert_eventually(lambda: _ring_counts(kafka_bootstrap, ring, slots)[0] >= len(due),
                          timeout_s=30, message="the first task wrote every timer to its ring")
        assert _ring_counts(kafka_bootstrap, ring, slots)[1] == 0, "its ring writes committed"
        first.kill()
        first.join(30)

        second.start()   # killed once it delivered some of the slot (it sends them over 2 s)
        assert_eventually(lambda: _ring_counts(kafka_bootstrap, config.real, 1)[1] > 0,
                          timeout_s=60, interval_s=0.2, message="the second task delivering")
        second.kill()
        second.join(30)
    finally:
        for task in (first, second):
            if task.is_alive():
                task.kill()
    partway = len(consume_all(kafka_bootstrap, config.real, expected=0, idle_s=1))   # both killed
    # It held 600 rows at most: with fewer than 1,400 sent, it had not read the whole slot.
    assert 0 < partway < len(due) - 600, f"{partway} of {len(due)} sent before the kill"

    third_ms = int(time.time() * 1000)
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=len(due), timeout_s=60, idle_s=2)
    rows = ledger_of(kafka_bootstrap, config.ledger_topic, 2 * len(due))
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert thread.is_alive() is False and result, "the third task ended on its stop record"
    uniqs = [header_map(r)[H.UNIQ_KEY].decode() for r in records]
    assert sorted(uniqs) == sorted(due), "each timer once (read_committed)"
    assert all(r.timestamp >= due[u] for r, u in zip(records, uniqs)), "none early"
    late = max(r.timestamp - max(due[u], third_ms) for r, u in zip(records, uniqs))
    assert late < 5_000, f"up to {late} ms after its due time or the third task's start"
    delivered = [r for r in rows if r["status"] == "delivered"]
    assert sorted(r["uniq_key"] for r in delivered) == sorted(due)
    assert all(r["ring_offset"] is not None for r in delivered), "each through the ring"
    assert sorted(r["uniq_key"] for r in rows if r["status"] == "ringed") == sorted(due)


def test_a_task_killed_while_it_gathers_timers_for_its_ring_loses_none(
        dispatch, new_topic, kafka_bootstrap):
    """200 timers due 10 s on, read by a task that gathers its ring writes for 60 s
    (ring_write_ms), then an immediate message behind them on their intake partition; once
    that one is delivered (the timers were read) the task is killed (SIGKILL) with nothing in
    its ring. The next task reads them again from its commit point: each timer arrives once
    (read_committed), through the ring, never early, soon after its due time or the second
    task's start; the immediate message not again."""
    config = _ring_task(dispatch, new_topic)
    ring, slots = config.ring.topic, 10
    first = multiprocessing.get_context("spawn").Process(
        target=_run, args=(replace(config, ring=replace(config.ring, write_ms=60_000)),))
    try:
        first.start()
        assert_eventually(lambda: _ring_counts(kafka_bootstrap, config.ledger_topic, 1)[0] > 0,
                          timeout_s=60, message="the first task's clock probe (it is up)")
        due = _timers_in_one_slot(kafka_bootstrap, config, 200, per_ms=1)
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        producer.send(config.intake_topic, b"behind", partition=0, headers=[
            (H.REAL_TOPIC, config.real.encode()), (H.UNIQ_KEY, b"behind")]).get(timeout=30)
        producer.close()
        consume_all(kafka_bootstrap, config.real, expected=1, timeout_s=30)
        assert _ring_counts(kafka_bootstrap, ring, slots)[0] == 0, "the timers still gathered"
        first.kill()
        first.join(30)
    finally:
        if first.is_alive():
            first.kill()
    second_ms = int(time.time() * 1000)
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=len(due) + 1, timeout_s=60,
                          idle_s=2)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert thread.is_alive() is False and result, "the second task ended on its stop record"
    uniqs = [header_map(r)[H.UNIQ_KEY].decode() for r in records]
    assert sorted(uniqs) == sorted([*due, "behind"]), "each once (read_committed)"
    assert all(r.timestamp >= due[u] for r, u in zip(records, uniqs) if u in due), "none early"
    late = max(r.timestamp - max(due[u], second_ms) for r, u in zip(records, uniqs) if u in due)
    assert late < 5_000, f"up to {late} ms after its due time or the second task's start"
    rows = ledger_of(kafka_bootstrap, config.ledger_topic, len(due), status="ringed")
    assert sorted(r["uniq_key"] for r in rows if r["status"] == "ringed") == sorted(due)


def test_a_slot_larger_than_the_task_s_bound_is_read_in_parts_each_once_and_never_early(
        dispatch, new_topic, kafka_bootstrap, monkeypatch):
    """4,000 timers due over one 2 s slot, and a task that holds at most 500 rows
    (`dispatch_max_held`, 100 read a turn): it reads the slot in parts as it sends, holding no
    more than its bound and one read (before, one read of the slot took all of it); each timer
    arrives once (read_committed), never early, within 3 s of its due time."""
    from streaming.dispatch.task import _Task

    config = _ring_task(dispatch, new_topic, max_held=500, read_batch=100)
    peak, hold = [0], _Task._hold

    def counted(task, row):
        hold(task, row)
        peak[0] = max(peak[0], task._holding())
    monkeypatch.setattr(_Task, "_hold", counted)
    thread, result = in_thread(config)
    assert_eventually(lambda: _ring_counts(kafka_bootstrap, config.ledger_topic, 1)[0] > 0,
                      timeout_s=60, message="the task's clock probe (it is up)")
    due = _timers_in_one_slot(kafka_bootstrap, config, 4_000, per_ms=2)
    records = consume_all(kafka_bootstrap, config.real, expected=len(due), timeout_s=60,
                          idle_s=2)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert thread.is_alive() is False and result, "the task ended on its stop record"
    uniqs = [header_map(r)[H.UNIQ_KEY].decode() for r in records]
    assert sorted(uniqs) == sorted(due), "each timer once (read_committed)"
    assert all(r.timestamp >= due[u] for r, u in zip(records, uniqs)), "none early"
    late = max(r.timestamp - due[u] for r, u in zip(records, uniqs))
    assert late < 3_000, f"up to {late} ms after its due time"
    assert 500 <= peak[0] < 500 + 100, f"held {peak[0]} rows at most"
    print(f"a slot of {len(due)} timers, {config.max_held} held at most: held {peak[0]} at "
          f"most, the last {late} ms after its due time")


def test_a_task_counts_the_timers_in_its_ring_not_its_transactions_markers(
        dispatch, new_topic, kafka_bootstrap):
    """Three timers due in one slot 10 s on, each written to the ring in a transaction of its
    own: the task's commits report 3 timers held (the pending gauge's level -1), not the 5
    offsets (3 records, 2 commit markers) its position lies before the end there; once they
    are sent, none."""
    from tests.integration.test_dispatch import _committed

    config = _ring_task(dispatch, new_topic)
    held = lambda: json.loads(_committed(config).metadata or "{}").get("held")  # noqa: E731
    thread, result = in_thread(config)
    assert_eventually(lambda: _ring_counts(kafka_bootstrap, config.ledger_topic, 1)[0] > 0,
                      timeout_s=60, message="the task's clock probe (it is up)")
    slot_start = -(-(int(time.time() * 1000) + 10_000) // 2_000) * 2_000
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for i in range(3):
        producer.send(config.intake_topic, b"v", partition=0, headers=[
            (H.REAL_TOPIC, config.real.encode()), (H.TIMER_DELIVER_MS, str(slot_start + i)
                                                   .encode()),
            (H.UNIQ_KEY, f"c{i}".encode())]).get(timeout=30)
        ledger_of(kafka_bootstrap, config.ledger_topic, i + 1, status="ringed")
    producer.close()
    time.sleep(0.6)   # commits every 0.2 s: one made after the third write's
    assert held() == {"-1": 3}, "3 timers held in the ring"
    assert int(time.time() * 1000) < slot_start - 1_500, "counted before the slot's read"
    consume_all(kafka_bootstrap, config.real, expected=3, timeout_s=30)
    assert_eventually(lambda: held() == {}, timeout_s=10, message="none held once sent")
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert thread.is_alive() is False and result, "the task ended on its stop record"


def test_the_ring_write_bench_writes_what_it_reports_at_each_cadence(kafka_bootstrap, work_dir):
    """streaming.tools.bench_ring_write, the figures behind conf's ring_write_ms, on the real
    broker: at each cadence its timers, all committed, over every partition, and a line that says
    so with the broker's CPU."""
    from pathlib import Path

    from streaming.tools import bench_ring_write, broker

    pid = broker.read_pid(broker.BrokerSpec(home=work_dir / "kafka", jars=Path()))
    if pid is None:
        pytest.skip("the session's broker is not this run's (DELAYQ_TEST_BOOTSTRAP)")
    for write_ms in (50, 500):
        line, topic, written = bench_ring_write.run(kafka_bootstrap, pid, rate=500, partitions=4,
                                                    write_ms=write_ms, seconds=2)
        assert 500 <= written <= 1_000, line
        records = consume_all(kafka_bootstrap, topic, expected=written, idle_s=1)
        assert len(records) == written and {r.partition for r in records} == set(range(4))
        assert line.startswith(f"written every {write_ms} ms: ") and "the broker used" in line


def test_a_cold_bucket_rolled_while_the_ring_is_busy_goes_through_the_ring_once(
        job_settings, start_job, new_topic, kafka_bootstrap, spark, lateness_log):
    """Timers due 30-31 s out wait in the cold tier (a ring of 12 slots of 2 s: a horizon of
    20 s; buckets of 2 s roll 17 s ahead) while timers due 3-18 s out keep the rings busy. The
    rolled ones go to their task's ring and are read from it: each delivered once, never early,
    within 2 s; one cancelled in the cold tier and one cancelled in the ring never arrive. Each
    message is received once (a rolled timer's ledger rows count none again), and the timers
    pending go back to 0 (the roll counted the wheel's out)."""
    import threading
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from sinks.metrics import Metrics
    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables
    from tests.integration.test_dispatch import ledger_of

    settings = job_settings(ring_slots=12, cold_bucket="2s", clock_tolerance="1s")
    assert settings.rolls_to_ring and settings.roll_lead_ms == 17_000
    real = new_topic(**LOG_APPEND)
    metrics = Metrics(CollectorRegistry(), version="test", spark_version="test")
    job = start_job(settings, metrics=metrics)
    sample = metrics.registry.get_sample_value
    sent, busy = {}, {}
    due = (int(time.time() * 1000) // 1000 + 30) * 1000
    with DelayProducer(settings) as producer:
        cold = [producer.send(real, f"c{i}".encode(), deliver_at_ms=due + i * 10)
                for i in range(120)]

        def keep_busy():   # 20 timers/s due 3-18 s out, on every task's ring
            for i in range(500):
                h = producer.send(real, f"b{i}".encode(), delay_ms=3_000 + (i * 1_777) % 15_000)
                busy[h.uniq_key] = Sent(None, f"b{i}".encode(), [], h.due_ms)
                time.sleep(0.05)
        load = threading.Thread(target=keep_busy)
        load.start()
        producer.cancel(cold[0])   # in the cold tier
        where = lambda h: lookup.find(Tables(lambda: spark), settings, h.uniq_key,  # noqa
                                      Path(job.checkpoint)).detail.get("where")
        assert_eventually(lambda: where(cold[1]) == "the dispatch task's ring", timeout_s=25,
                          message="the rolled timer in the ring")
        assert int(time.time() * 1000) < due - 3_000, "rolled early enough to cancel there"
        producer.cancel(cold[1])
        load.join()
    sent.update(busy)
    sent.update({h.uniq_key: Sent(None, f"c{i}".encode(), [], h.due_ms)
                 for i, h in enumerate(cold) if i > 1})
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=4)
    late: list[int] = []
    check_deliveries(records, sent, lateness_log=late)
    lateness_log.extend(late)
    assert max(late) < 2_000, f"late by up to {max(late)} ms"
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, len(sent), status="delivered")
    rolled = {h.uniq_key for h in cold[2:]}
    delivered = [r for r in rows if r["status"] == "delivered" and r["uniq_key"] in rolled]
    assert len(delivered) == len(rolled) and all(
        r["ring_offset"] is not None and r["ready_offset"] is None for r in delivered), \
        "every rolled timer read from the ring, none fired by the wheel"
    status = lambda h: lookup.find(Tables(lambda: spark), settings, h.uniq_key,  # noqa: E731
                                   Path(job.checkpoint)).status
    for handle in cold[:2]:
        assert_eventually(lambda: status(handle) == "cancelled", timeout_s=60,
                          message="the ledger says cancelled")
    total = lambda name: sum(s.value for family in metrics.registry.collect()  # noqa: E731
                             if family.name == name for s in family.samples
                             if s.name.endswith("_total"))
    assert_eventually(lambda: total("delayq_messages_received") == len(sent) + 2,
                      timeout_s=60, message="each message received once")
    assert_eventually(lambda: sample("delayq_pending_messages", {"level": "-1"}) == 0,
                      timeout_s=30, message="no timer pending")
    assert sample("delayq_messages_cancelled_total") == 2
