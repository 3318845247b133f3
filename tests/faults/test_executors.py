"""The delivery path: the wheel fires into the ready topic, dispatch tasks in the executors
send each message at its due time, and the ledger query writes the ledger (DESIGN.md 4)."""
from __future__ import annotations

import time

from pyspark.sql import functions as F

from sinks.delta import table_exists
from streaming.ledger import lookup
from streaming.producer import DelayProducer
from tests.faults.conftest import SteadyLoad, check_all_delivered, real_topic
from streaming.cli.status import fetch
from tests.support import assert_eventually, free_ports

# The held timer sits in the ready topic for the fire lead before it is due: 40 s leaves the
# checks below time in a busy full run (with 12 s, one ran out of it at -4 s).
EXECUTORS = dict(ledger_interval="2s", fire_lead_ms=40_000)


def ledger_counts(spark, settings) -> dict[str, int]:
    if not table_exists(settings.ledger_path):
        return {}
    ledger = spark.read.format("delta").load(str(settings.ledger_path))
    return {r["uniq_key"]: r["n"] for r in
            ledger.groupBy("uniq_key").agg(F.count("*").alias("n")).collect()}


def test_the_dispatch_tasks_deliver_on_time_and_the_ledger_holds_each_once(
        job_process, spark, capsys):
    [metrics_port] = free_ports(1)
    job, settings = job_process(**EXECUTORS, metrics_port=metrics_port)
    real = real_topic(settings)
    job.start()
    load = SteadyLoad(settings, real)
    load.start()
    with DelayProducer(settings) as producer:
        later = producer.send(real, b"later", delay_ms=70_000)
        lost = producer.send(f"missing-{settings.intake_topic}", b"nowhere", level=1)
    time.sleep(10)
    load.stop()
    check_all_delivered(settings, real, load.sent)
    # Fired into the ready topic the fire lead before it is due, and held there by its dispatch
    # task: `delayq ledger` finds it pending in the ready topic.
    held = assert_eventually(lambda: lookup.in_topics(settings, later.uniq_key),
                             timeout_s=60, message="the timer pending in the ready topic")
    assert held.status == "pending" and held.detail["topic"] == real
    assert "ready topic" in held.detail["where"]
    # Everything else delivered: the pending gauge counts the timer its dispatch task holds.
    pending = lambda: sum(v for _, v in fetch(f"http://127.0.0.1:{metrics_port}/metrics")
                          .get("delayq_pending_messages", []))
    assert_eventually(lambda: pending() == 1 or None, timeout_s=later.due_ms / 1000 - time.time(),
                      message="the pending gauge at 1 (the held timer)")
    load.sent[later.uniq_key] = later.due_ms
    outcome = check_all_delivered(settings, real, load.sent)
    assert outcome.duplicates == 0, "no crash, no duplicate"
    assert_eventually(lambda: set(ledger_counts(spark, settings)) >= set(load.sent),
                      timeout_s=60, message="ledger rows for every delivered message")
    # A real topic that does not exist: the dispatch task dead-letters the message, and the
    # ledger query writes it to the dead-letter table with its reason.
    dead_rows = lambda: (table_exists(settings.dead_letter_path) and spark.read.format("delta")
                         .load(str(settings.dead_letter_path))
                         .filter(F.col("uniq_key") == lost.uniq_key).collect()) or None
    dead = assert_eventually(dead_rows, timeout_s=60, message="the dead-letter table's row")
    assert len(dead) == 1 and "does not exist" in dead[0]["reason"], dead
    assert bytes(dead[0]["value"]) == b"nowhere"
    assert_eventually(lambda: pending() == 0 or None, timeout_s=30,
                      message="the pending gauge at 0 once all is delivered")
    job.stop()
    counts = ledger_counts(spark, settings)
    assert set(counts) == set(load.sent) and all(n == 1 for n in counts.values())
    with capsys.disabled():
        lateness = sorted(outcome.lateness_ms)
        print(f"\nexecutors: {len(load.sent)} messages, lost 0, early 0, lateness p50 "
              f"{lateness[len(lateness) // 2]} ms, max {lateness[-1]} ms")
