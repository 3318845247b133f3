"""Clocks that differ between hosts (DESIGN.md section 3), for real: the broker runs under
libfaketime with its clock 10 s ahead of the job's host, or 10 s behind it, and every delivery
path is judged on the broker's clock alone (the real topic's LogAppendTime against the intake's
append time plus the delay): the short levels the dispatch tasks read themselves, a level and a
timer that wait in the wheel's state, and a timer that waits in the cold tier. Unshifted clocks are every other delivery test's."""
from __future__ import annotations

import glob
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from tests.conftest import PROJECT
from tests.integration.conftest import Sent
from tests.support import check_deliveries, consume_all, free_ports

SHIFT_S = 10
# Every delivery of the run within this of its due time, shifted or not: each path's messages
# reach their dispatch task before they are due and leave by its hold (on this 2-core host, in
# three runs, unshifted too: at most 438 ms late; a dispatch task holding by its own clock was
# 10 s late).
LATENESS_BOUND_MS = 3000
# libfaketime from Debian's faketime package (deploy/setup.sh installs it). On the JVM it needs
# real monotonic clocks (else it spins and never serves) and its monotonic fix off (else every
# timed wait of the JVM's threads returns at once: the broker burned two cores idle).
FAKETIME_ENV = {"FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_FORCE_MONOTONIC_FIX": "0"}


def faketime_library() -> str:
    found = glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
    assert found, "libfaketime is not installed; deploy/setup.sh installs Debian's faketime"
    return found[0]


@pytest.fixture(scope="module", params=[SHIFT_S, -SHIFT_S], ids=["broker-ahead", "broker-behind"])
def broker_clock(request, work_dir):
    """(bootstrap, shift in s): a broker whose clock runs `shift` ahead of this host's."""
    from streaming.tools import broker

    shift = request.param
    port, controller = free_ports(2)
    spec = broker.BrokerSpec(
        home=work_dir / f"kafka-skew-{shift:+d}", jars=PROJECT / ".lib" / "kafka", port=port,
        controller_port=controller, heap="512m",
        env={"LD_PRELOAD": faketime_library(), "FAKETIME": f"{shift:+d}", **FAKETIME_ENV})
    broker.start(spec)
    try:
        yield spec.bootstrap, shift
    finally:
        broker.stop(spec)


def broker_offset_ms(bootstrap: str, topic: str) -> int:
    """The broker's clock minus this host's, from a record's LogAppendTime (within its trip)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        before = time.time() * 1000
        stamp = producer.send(topic, b"clock").get(timeout=30).timestamp
        return int(stamp - (before + time.time() * 1000) / 2)
    finally:
        producer.close()


def steady(progress: list[dict]) -> bool:
    """The last three batches took under 3 s each (the watermark then trails by about two
    batches, well within the 20 s lead, also in a slow hour of this host)."""
    last = [p["durationMs"].get("triggerExecution", 10**6) for p in progress[-3:]]
    return len(last) == 3 and max(last) < 3000


def test_every_path_is_on_time_by_the_broker_s_clock(broker_clock, spark, work_dir, lateness_log):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from conf import load_settings
    from streaming.job import DelayJob
    from streaming.producer import DelayProducer
    from tests.support import assert_eventually

    bootstrap, shift = broker_clock
    tag = uuid.uuid4().hex[:8]
    real, stamped = f"skew-real-{tag}", f"skew-stamped-{tag}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(real, 1, 1, topic_configs={
        "message.timestamp.type": "LogAppendTime"}), NewTopic(stamped, 1, 1, topic_configs={
            "message.timestamp.type": "CreateTime"})])
    admin.close()
    offset = broker_offset_ms(bootstrap, real)
    assert abs(offset - shift * 1000) < 1000, f"the broker's clock is {offset} ms off, not {shift} s"

    # Levels 0-1 the dispatch tasks' own, 22 s the wheel's: it waits in the wheel's state for
    # 2 s, as the 22 s timer, since the wheel fires 20 s ahead (the fire lead: a young job's
    # batches take seconds each on two cores); timers 50 s out wait in the cold tier (horizon
    # 15 s), which rolls them into the wheel 15 s plus the clock tolerance (15 s, 1.5 times the
    # skew) before their bucket is due.
    settings = load_settings(
        bootstrap_servers=bootstrap, data_dir=work_dir / f"skew-{tag}", delay_levels="1s 22s",
        dispatch_direct_max_delay_ms=1000, fire_lead_ms=20_000, near_horizon="15s",
        cold_bucket="5s", clock_tolerance="15s", spark_master="local[*]",
        spark_shuffle_partitions=2, ledger_interval="10s", intake_topic=f"intake-{tag}",
        dlq_topic=f"intake-{tag}.DLQ")
    job = DelayJob(settings, spark, checkpoint=str(work_dir / f"ckpt-skew-{tag}"))
    try:
        job.start()
        sent = {}

        def send(producer, name: str, **kwargs) -> None:
            for i in range(4):
                value = f"{name}-{i}".encode()
                handle = producer.send(real, value, key=value, **kwargs)
                sent[handle.uniq_key] = Sent(value, value, [], handle.due_ms)
        # The cold timers first, and a warm-up message: the batch that parks the first cold
        # messages creates the cold tier's Delta table, which holds the wheel for seconds.
        with DelayProducer(settings) as producer:
            send(producer, "cold", delay_ms=50_000)
            producer.send(real, b"warm-up", level=1)
        consume_all(bootstrap, real, expected=2, timeout_s=60)   # with the clock's record
        cold = Path(settings.cold_path) / "_delta_log"
        assert_eventually(lambda: cold.is_dir() and any(p.suffix == ".json" for p in cold.iterdir()),
                          timeout_s=60, message="the cold timers parked in the cold tier")
        # A young job's batches take seconds each on two cores (a Spark session's first job's
        # more); the wheel fires 20 s ahead: the rest is sent once they are down to steady ones.
        assert_eventually(lambda: steady(job.query.recentProgress), timeout_s=120,
                          message="the wheel's batches under 3 s")
        with DelayProducer(settings) as producer:
            for name, kwargs in (("now", dict(level=0)), ("short", dict(level=1)),
                                 ("level-22s", dict(level=2)),
                                 ("timer", dict(delay_ms=22_000))):
                send(producer, name, **kwargs)
            # On a CreateTime topic the record's timestamp is the dispatch task's to set.
            for level in (1, 2):
                producer.send(stamped, b"stamped", level=level)
        records = consume_all(bootstrap, real, expected=len(sent), timeout_s=120, idle_s=2,
                              done=lambda got: len(got) >= len(sent) + 2)   # and the first two
        assert_eventually(lambda: job.query.isActive, timeout_s=1, message="the job running")
    finally:
        job.stop()
    records = [r for r in records if r.value not in (b"clock", b"warm-up")]
    stamps = consume_all(bootstrap, stamped, expected=2, timeout_s=30)   # due long before
    assert len(stamps) == 2
    for r in stamps:
        assert r.timestamp >= int(dict(r.headers)["DELIVER_MS"]), "stamped before it was due"
    # On the broker's clock: DELIVER_MS is the intake's append time plus the delay, and the
    # real topic's append time is never before it.
    check_deliveries(records, sent, lateness_log=lateness_log)
    late = {r.value.decode(): r.timestamp - int(dict(r.headers)["DELIVER_MS"]) for r in records}
    worst = max(late, key=late.get)
    assert late[worst] < LATENESS_BOUND_MS, f"{worst} {late[worst]} ms late (shift {shift} s): {late}"
