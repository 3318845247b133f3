"""The job is killed (SIGKILL, driver and JVM) at random moments under steady load and
restarted from its checkpoint: every message is delivered, none early, duplicates only with
the same UNIQ_KEY, and the ledger holds every delivered message exactly once."""
from __future__ import annotations

import random
import threading
import time

from pyspark.sql import functions as F

from streaming.admin import admin_client, create_topic
from streaming.producer import DelayProducer
from tests.support import assert_eventually, consume_all, header_map

KILLS = 2


def test_kill_and_restart_loses_nothing_and_ledger_is_exact(job_process, spark, capsys):
    job, settings = job_process()
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start()

    sent: dict[str, int] = {}  # UNIQ_KEY -> due_ms
    meta: dict[str, tuple] = {}
    events: list[tuple[str, float]] = []
    stop = threading.Event()

    def produce():
        with DelayProducer(settings) as producer:
            i = 0
            while not stop.is_set():
                handle = producer.send(real, f"m{i}".encode(), key=str(i).encode(),
                                       level=random.choice((0, 1, 2, 3)))
                sent[handle.uniq_key] = handle.due_ms
                meta[handle.uniq_key] = (handle.level, handle.partition, handle.offset, time.time())
                i += 1
                time.sleep(0.02)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    rng = random.Random(7)
    for _ in range(KILLS):
        time.sleep(rng.uniform(4, 10))
        events.append(("kill", time.time()))
        job.kill()
        time.sleep(rng.uniform(0, 3))
        job.start()
        events.append(("ready", time.time()))
    time.sleep(5)
    stop.set()
    producer.join(timeout=30)

    # Duplicates are allowed after a crash, so wait for every UNIQ_KEY, not for a count.
    every_key = lambda got: {header_map(r)["UNIQ_KEY"].decode() for r in got} >= set(sent)
    records = consume_all(settings.bootstrap, real, expected=len(sent), timeout_s=180,
                          idle_s=5, done=every_key)
    # The ledger is written after Kafka in each batch: let the last batch finish first.
    ledger_keys = lambda: {r["uniq_key"] for r in spark.read.format("delta")
                           .load(str(settings.ledger_path)).select("uniq_key").collect()}
    assert_eventually(lambda: ledger_keys() >= set(sent), timeout_s=60,
                      message="ledger rows for every delivered message")
    job.stop()
    counts: dict[str, int] = {}
    for record in records:
        headers = header_map(record)
        uniq = headers["UNIQ_KEY"].decode()
        assert uniq in sent, f"unknown delivery {uniq}"
        assert int(headers["DELIVER_MS"]) == sent[uniq]
        assert record.timestamp >= sent[uniq], f"{uniq} early by {sent[uniq] - record.timestamp} ms"
        counts[uniq] = counts.get(uniq, 0) + 1
    lost = set(sent) - set(counts)
    duplicates = sum(n - 1 for n in counts.values())
    if lost:
        ledger_keys = {r["uniq_key"] for r in spark.read.format("delta").load(str(settings.ledger_path)).select("uniq_key").collect()}
        with capsys.disabled():
            print("\nEVENTS", events)
            for k in sorted(lost, key=lambda k: meta[k][3]):
                print("LOST", k, meta[k], "due", sent[k], "in ledger", k in ledger_keys)
            print("LOG", job.log)
    assert not lost, f"{len(lost)} of {len(sent)} lost"

    ledger = spark.read.format("delta").load(str(settings.ledger_path))
    per_key = {r["uniq_key"]: r["n"] for r in ledger.groupBy("uniq_key").agg(F.count("*").alias("n")).collect()}
    assert set(per_key) == set(sent), f"ledger misses {len(set(sent) - set(per_key))}"
    assert all(n == 1 for n in per_key.values()), "ledger rows must be exactly once"
    with capsys.disabled():
        print(f"\nkill test: {KILLS} kills, {len(sent)} messages, lost 0, early 0, "
              f"duplicates in Kafka {duplicates}, ledger rows {len(per_key)} (exactly once)")
