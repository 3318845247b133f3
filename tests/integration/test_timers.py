"""Timer messages (RocketMQ 5: any deliver time) and cancel (RocketMQ 5.3: recall)."""
from __future__ import annotations

import time

from kafka import KafkaProducer

from streaming.producer import DelayProducer, Handle
from tests.integration.conftest import Sent
from tests.support import assert_eventually, check_deliveries, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_absolute_relative_and_past_timers(job_settings, start_job, new_topic, kafka_bootstrap,
                                           lateness_log):
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    sent = {}
    with DelayProducer(settings) as producer:
        now_ms = int(time.time() * 1000)
        for name, kwargs in (("absolute", dict(deliver_at_ms=now_ms + 2_500)),
                             ("relative", dict(delay_ms=1_500)),
                             ("past", dict(deliver_at_ms=now_ms - 5_000))):
            h = producer.send(real, name.encode(), key=name.encode(), **kwargs)
            sent[h.uniq_key] = Sent(name.encode(), name.encode(), [], h.due_ms)
        assert sent[h.uniq_key].due_ms >= now_ms - 5_000, "a past time is due at append time"
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    meta = raw.send(settings.intake_topic, b"seconds", key=b"seconds", partition=1,
                    headers=[("REAL_TOPIC", real.encode()), ("TIMER_DELAY_SEC", b"2"),
                             ("UNIQ_KEY", b"sec-1")]).get(timeout=30)
    raw.close()
    sent["sec-1"] = Sent(b"seconds", b"seconds", [], meta.timestamp + 2_000)
    records = consume_all(kafka_bootstrap, real, expected=4, timeout_s=60, idle_s=2)
    check_deliveries(records, sent, lateness_log=lateness_log)
    past = next(r for r in records if r.value == b"past")
    assert past.timestamp - sent[header_map(past)["UNIQ_KEY"].decode()].due_ms < 10_000


def test_timer_beyond_the_maximum_is_dead_lettered(job_settings, start_job, new_topic,
                                                   kafka_bootstrap):
    settings = job_settings(max_delay="1m")
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    with DelayProducer(settings) as producer:
        producer.send(real, b"too far", delay_ms=120_000)
    [dead] = consume_all(kafka_bootstrap, settings.dlq_topic, expected=1, timeout_s=60)
    assert "beyond the maximum delay of 60 s" in header_map(dead)["DLQ_REASON"].decode()


def test_cancelled_messages_never_arrive_while_their_neighbours_do(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log):
    # A cancel must reach the job before its message's due time minus the fire lead: at the
    # default lead (12 s) these 6 s messages fire in the batch that reads them.
    # The levels' cancels meet them in the wheel, the timer's in its dispatch task's ring.
    from prometheus_client import CollectorRegistry

    from sinks.metrics import Metrics
    from tests.support import assert_eventually

    settings = job_settings(delay_levels="1s 2s 6s", fire_lead_ms=2000)
    real = new_topic(**LOG_APPEND)
    metrics = Metrics(CollectorRegistry(), version="test", spark_version="test")
    start_job(settings, metrics=metrics)
    sent, cancelled = {}, []
    with DelayProducer(settings) as producer:
        handles = [producer.send(real, f"m{i}".encode(), level=3) for i in range(6)]
        timer = producer.send(real, b"timer", delay_ms=6_000)
        for i, h in enumerate(handles):
            if i % 3 == 0:
                cancelled.append(h)
            else:
                sent[h.uniq_key] = Sent(None, f"m{i}".encode(), [], h.due_ms)
        cancelled.append(timer)
        for h in cancelled:
            producer.cancel(Handle.parse(h.token()))  # as `delayq cancel` reads its handle
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=4)
    check_deliveries(records, sent, lateness_log=lateness_log)
    count = lambda name: metrics.registry.get_sample_value(name) or 0   # noqa: E731
    assert_eventually(lambda: count("delayq_messages_cancelled_total") == len(cancelled),
                      timeout_s=60, message="every cancel counted")
    assert count("delayq_cancel_misses_total") == 0


def test_cancel_after_delivery_is_counted_and_harmless(job_settings, start_job, new_topic,
                                                       kafka_bootstrap):
    """Both cancels are due within the direct window of their append (one after its message was
    delivered, one of a message never sent, due years ago): the dispatch task counts each as a
    miss once the wheel has read it too (streaming/dispatch/cancels.py)."""
    from prometheus_client import CollectorRegistry

    from sinks.metrics import Metrics

    settings = job_settings(ledger_interval="2s")   # misses are counted by the ledger query
    real = new_topic(**LOG_APPEND)
    metrics = Metrics(CollectorRegistry(), version="test", spark_version="test")
    job = start_job(settings, metrics=metrics)
    with DelayProducer(settings) as producer:
        handle = producer.send(real, b"x", level=1)
        consume_all(kafka_bootstrap, real, expected=1, timeout_s=60)
        producer.cancel(handle)
        producer.cancel(Handle.parse("NEVER-SENT@1700000000000@2"))
        later = producer.send(real, b"y", level=1)
    records = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60)
    assert {header_map(r)["UNIQ_KEY"].decode() for r in records} == {handle.uniq_key, later.uniq_key}
    misses = lambda: metrics.registry.get_sample_value("delayq_cancel_misses_total")  # noqa
    assert_eventually(lambda: misses() == 2, timeout_s=60, message="both cancels counted as misses")
    time.sleep(settings.ledger_interval_ms / 1000 + 2)
    assert misses() == 2, "each once"
    assert not metrics.registry.get_sample_value("delayq_messages_cancelled_total")
    assert job.query.isActive


def test_a_cancel_after_its_message_fired_misses_and_the_message_arrives_on_time(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log):
    """The documented window of a cancel: it must reach the job before its message's due time
    minus the fire lead. A 20 s timer at the default lead (12 s) fires about 8 s after it is
    sent and waits in its dispatch task; a cancel sent once it is there is counted as a miss,
    and the message is still delivered, on time and not early. A cancel due within the ring's
    horizon of its append goes to the dispatch task, which drops the target it holds: the
    horizon is 4 s here, so that the cancel, sent up to a wheel batch (2 s) and the polls after
    the fire, is still the wheel's."""
    from tests.support import assert_eventually

    settings = job_settings(ring_slots=4)
    assert (settings.ring_slots - 2) * settings.ring_slot_ms == 4_000
    assert settings.fire_lead_ms == 12_000
    real = new_topic(**LOG_APPEND)
    summaries = []
    job = start_job(settings, on_batch=summaries.append)
    with DelayProducer(settings) as producer:
        handle = producer.send(real, b"too late to cancel", delay_ms=20_000)
    assert_eventually(lambda: sum(job._dispatcher.reports()[0].values()) == 1, timeout_s=30,
                      message="the timer fired into its dispatch task")
    assert int(time.time() * 1000) < handle.due_ms - 4_000, "the cancel is the wheel's"
    with DelayProducer(settings) as producer:
        producer.cancel(handle)
    assert_eventually(lambda: sum(s.count("cancel_unknown") for s in summaries) == 1,
                      timeout_s=30, message="the cancel counted as a miss")
    records = consume_all(kafka_bootstrap, real, expected=1, timeout_s=60, idle_s=2)
    check_deliveries(records, {handle.uniq_key: Sent(None, b"too late to cancel", [],
                                                     handle.due_ms, None)},
                     lateness_log=lateness_log)
    assert sum(s.count("cancelled") for s in summaries) == 0

def test_far_future_messages_survive_a_restart_and_the_roll_from_the_cold_tier(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log, work_dir):
    from pathlib import Path

    # Due in ~30 s, parked cold (horizon 8 s), the job restarted meanwhile: the roll into the
    # wheel happens after the restart, and the messages still arrive on time.
    settings = job_settings(delay_levels="1s 2s 28s", near_horizon="8s", cold_bucket="2s",
                            clock_tolerance="1s")
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-cold-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    sent = {}
    with DelayProducer(settings) as producer:
        for name, kwargs in (("timer", dict(delay_ms=30_000)), ("level", dict(level=3))):
            h = producer.send(real, name.encode(), key=name.encode(),
                              headers=[("trace", name.encode())], **kwargs)
            sent[h.uniq_key] = Sent(name.encode(), name.encode(), [("trace", name.encode())],
                                    h.due_ms)
    cold = Path(settings.cold_path) / "_delta_log"
    from tests.support import assert_eventually
    assert_eventually(lambda: cold.is_dir() and any(p.suffix == ".json" for p in cold.iterdir()),
                      timeout_s=30, message="far messages parked in the cold tier")
    job.stop()
    start_job(settings, checkpoint=checkpoint)
    with DelayProducer(settings) as producer:
        h = producer.send(real, b"near", key=b"near", headers=[("trace", b"near")], level=1)
        sent[h.uniq_key] = Sent(b"near", b"near", [("trace", b"near")], h.due_ms)
    records = consume_all(kafka_bootstrap, real, expected=3, timeout_s=90, idle_s=2)
    check_deliveries(records, sent, lateness_log=lateness_log)
    assert all(k != "DELAYQ_ROLLED" for r in records for k, _ in r.headers)


# The cold tier in seconds: timers 30 s out wait there (horizon 14 s, buckets of 2 s) and roll
# into the wheel 15-17 s before they are due (the horizon and the 1 s clock tolerance), a batch
# later; a 2 s fire lead leaves a cancel several seconds to reach a rolled timer in the wheel,
# on a slow day too. No ring, so the rolls feed the wheel (into the rings: test_ring.py).
COLD = dict(delay_levels="1s 2s 28s", near_horizon="14s", cold_bucket="2s", fire_lead_ms=2000,
            clock_tolerance="1s", ring_slots=0)


def cancel_elsewhere(settings, bootstrap: str, uniq_key: str, due_ms: int) -> None:
    """A timer's cancel written by a plain Kafka client to another intake partition than the
    one DelayProducer puts its timer in, so the two travel apart."""
    import zlib

    raw = KafkaProducer(bootstrap_servers=bootstrap)
    parts = len(raw.partitions_for(settings.intake_topic))
    raw.send(settings.intake_topic, value=b"", partition=(zlib.crc32(uniq_key.encode()) + 1) % parts,
             headers=[("TIMER_DEL_UNIQKEY", uniq_key.encode()),
                      ("TIMER_DELIVER_MS", str(due_ms).encode())]).get(timeout=30)
    raw.close()


def test_a_cancel_finds_its_timer_in_the_cold_tier_in_the_wheel_and_ahead_of_it(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log, spark):
    """Four timers due at the same moment, parked in the cold tier: one cancelled while it
    waits there, one whose cancel came first (on another intake partition), one cancelled once
    its bucket rolled into the wheel; the fourth, their neighbour, arrives on time. Every cancel
    is counted as one, none as a miss, and `delayq ledger` says "cancelled"."""
    import json
    from pathlib import Path

    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables
    from tests.support import assert_eventually

    settings = job_settings(**COLD)
    real = new_topic(**LOG_APPEND)
    summaries = []
    job = start_job(settings, on_batch=summaries.append)
    due = (int(time.time() * 1000) // 1000 + 30) * 1000
    cancel_elsewhere(settings, kafka_bootstrap, "ahead", due)
    with DelayProducer(settings) as producer:
        kept = producer.send(real, b"kept", key=b"kept", deliver_at_ms=due)
        waiting = producer.send(real, b"waiting", deliver_at_ms=due)
        producer.cancel(waiting)
        producer.send(real, b"ahead", deliver_at_ms=due, uniq_key="ahead")
        rolled = producer.send(real, b"rolled", deliver_at_ms=due)
    marker = Path(job.checkpoint) / "cold" / "loaded_until"
    assert_eventually(lambda: json.loads(marker.read_text())["loaded_until"] >= due - due % 2000,
                      timeout_s=30, message="the timers' bucket rolled into the wheel")
    assert int(time.time() * 1000) < due - 4_000, "rolled early enough to cancel in the wheel"
    with DelayProducer(settings) as producer:
        producer.cancel(rolled)
    records = consume_all(kafka_bootstrap, real, expected=1, timeout_s=60, idle_s=4)
    check_deliveries(records, {kept.uniq_key: Sent(b"kept", b"kept", [], due)},
                     lateness_log=lateness_log)
    assert sum(s.count("cancelled") for s in summaries) == 3
    assert sum(s.count("cancel_unknown") for s in summaries) == 0
    for key in (waiting.uniq_key, "ahead", rolled.uniq_key):
        where = lookup.find(Tables(lambda: spark), settings, key, Path(job.checkpoint))
        assert where.status == "cancelled", (key, where)


# The default direct window: every message due within 12 s of its append skips the wheel.
WINDOW = dict(dispatch_direct_max_delay_ms=12_000)


def test_timers_due_within_the_window_skip_the_wheel_in_every_form(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log):
    """A TIMER_DELAY_SEC=3 timer, a TIMER_DELAY_MS one, a TIMER_DELIVER_MS 4 s ahead and one
    5 s in the past: each taken by a dispatch task straight from the intake (its ledger row
    names no ready record) and delivered within a second of its due time, never before."""
    from tests.integration.test_dispatch import ledger_of

    settings = job_settings(**WINDOW)
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    now = int(time.time() * 1000)
    forms = {"sec": ("TIMER_DELAY_SEC", b"3"), "ms": ("TIMER_DELAY_MS", b"2500"),
             "ahead": ("TIMER_DELIVER_MS", str(now + 4_000).encode()),
             "past": ("TIMER_DELIVER_MS", str(now - 5_000).encode())}
    sent = {}
    for name, (header, value) in forms.items():
        meta = raw.send(settings.intake_topic, name.encode(), key=name.encode(), headers=[
            ("REAL_TOPIC", real.encode()), (header, value), ("UNIQ_KEY", name.encode())]
                        ).get(timeout=30)
        due = {"sec": meta.timestamp + 3_000, "ms": meta.timestamp + 2_500,
               "ahead": max(meta.timestamp, now + 4_000), "past": meta.timestamp}[name]
        sent[name] = Sent(name.encode(), name.encode(), [], due)
    raw.close()
    records = consume_all(kafka_bootstrap, real, expected=4, timeout_s=60, idle_s=2)
    late: list[int] = []
    check_deliveries(records, sent, lateness_log=late)
    lateness_log.extend(late)
    assert max(late) < 1_000, dict(zip(sent, late))
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, 4)
    assert {r["uniq_key"]: r["ready_offset"] for r in rows} == dict.fromkeys(forms), \
        "read by a dispatch task from the intake, not fired by the wheel"


def test_a_cancel_within_the_window_finds_its_timer_in_its_dispatch_task(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log, spark):
    """A timer due 9 s out (the dispatch task holds it from its read) cancelled 1.5 s after it
    was sent, and two due 20 s out (through the wheel), cancelled 10 s and 6 s before their due
    time (their cancels in the window: to the task too): none arrives, their neighbours do, on
    time; `delayq ledger` says `cancelled`. The wheel fires fire_lead_ms (12 s) ahead: the one
    cancelled 6 s before is the task's to drop (ledger row `cancelled`), as is the 9 s one; the
    other is dropped by whichever side reads its cancel first (the wheel, after a late batch)."""
    from pathlib import Path

    from streaming.ledger import lookup
    from streaming.ledger.tables import Tables
    from tests.integration.test_dispatch import ledger_of

    settings = job_settings(**WINDOW)
    real = new_topic(**LOG_APPEND)
    job = start_job(settings)
    sent = {}
    with DelayProducer(settings) as producer:
        near, far10, far = (producer.send(real, b"cancelled", delay_ms=ms)
                            for ms in (9_000, 20_000, 20_000))
        for ms in (9_000, 20_000):
            h = producer.send(real, b"kept", delay_ms=ms)
            sent[h.uniq_key] = Sent(None, b"kept", [], h.due_ms)
        time.sleep(1.5)
        producer.cancel(near)
        time.sleep(max(0.0, (far10.due_ms - 10_000) / 1000 - time.time()))
        producer.cancel(far10)
        time.sleep(max(0.0, (far.due_ms - 6_000) / 1000 - time.time()))
        producer.cancel(far)
    records = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60, idle_s=3)
    late: list[int] = []
    check_deliveries(records, sent, lateness_log=late)
    lateness_log.extend(late)
    assert max(late) < 2_000, late
    # Awaited by the rows it checks (the deliveries came in the same transactions as theirs).
    rows = ledger_of(kafka_bootstrap, settings.ledger_topic, 2, status="cancelled")
    dropped = {r["uniq_key"]: r["status"] for r in rows if r["status"] != "delivered"}
    assert {near.uniq_key, far.uniq_key} <= set(dropped) <= {near.uniq_key, far.uniq_key,
                                                           far10.uniq_key}, dropped
    assert set(dropped.values()) == {"cancelled"}, dropped
    assert sorted(r["uniq_key"] for r in rows if r["status"] == "delivered") == sorted(sent)
    tables = Tables(lambda: spark)
    for handle in (near, far10, far):
        where = lookup.find(tables, settings, handle.uniq_key, Path(job.checkpoint))
        assert where.status == "cancelled", (handle, where)
