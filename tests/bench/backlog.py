"""Benchmark: does a far-future backlog slow the wheel? (issue: timers up to 30 days)

    .venv/bin/python -m tests.bench.backlog [--backlog 1000000] [--seconds 60] [--rate 50]

Starts a broker (from .lib/kafka, on free loopback ports) and the job in-process, then:
  A. a steady near load (level 2 = 2 s) for --seconds: lateness and batch durations;
  B. --backlog timer messages spread uniformly over 2 h … 30 d (cold tier), all taken in;
  C. the same near load again.
Prints lateness p50/p99/max, early count, median batch duration for A and C, their ratio,
and the bytes kept per pending message (wheel state on disk; cold tier table on disk).
Writes the figures as JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kafka import KafkaProducer

PROJECT = Path(__file__).resolve().parents[2]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def near_load(settings, real, seconds, rate, job):
    from streaming.producer import DelayProducer
    from tests.support import consume_all, header_map

    start_batch = job.query.lastProgress["batchId"]
    sent = {}
    with DelayProducer(settings) as producer:
        deadline = time.time() + seconds
        while time.time() < deadline:
            t = time.time()
            h = producer.send(real, b"x" * 256, level=2)
            sent[h.uniq_key] = h.due_ms
            time.sleep(max(0.0, 1.0 / rate - (time.time() - t)))
    every = lambda got: {header_map(r)["UNIQ_KEY"].decode() for r in got} >= set(sent)
    records = consume_all(settings.bootstrap, real, expected=len(sent), timeout_s=120, done=every)
    late = [r.timestamp - sent[header_map(r)["UNIQ_KEY"].decode()] for r in records
            if header_map(r)["UNIQ_KEY"].decode() in sent]
    batches = [p["durationMs"]["triggerExecution"] for p in job.query.recentProgress
               if p["batchId"] > start_batch]
    return {"messages": len(sent), "lost": len(set(sent) - {header_map(r)["UNIQ_KEY"].decode() for r in records}),
            "lateness_p50_ms": pct(late, 0.5), "lateness_p99_ms": pct(late, 0.99),
            "lateness_max_ms": max(late), "early": sum(1 for x in late if x < 0),
            "batch_median_ms": statistics.median(batches) if batches else None,
            "batch_p90_ms": pct(batches, 0.9)}


def backlog(settings, count, payload=256):
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=50,
                             batch_size=1 << 20, acks=1)
    now = int(time.time() * 1000)
    lo, hi = now + 2 * 3_600_000, now + 30 * 86_400_000 - 3_600_000
    # A random body per message: a repeated one would compress away in the cold tier's
    # Parquet files and understate the bytes kept per message.
    t0 = time.time()
    for i in range(count):
        body = os.urandom(payload)
        producer.send(settings.intake_topic, value=body, partition=i % 3, headers=[
            ("REAL_TOPIC", b"bench-far"), ("UNIQ_KEY", f"far-{i}".encode()),
            ("TIMER_DELIVER_MS", str(random.randint(lo, hi)).encode())])
    producer.flush()
    producer.close()
    return time.time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--out", default=str(PROJECT / "docs" / "bench-backlog.json"))
    args = parser.parse_args()

    from conf import load_settings
    from streaming import broker
    from streaming.admin import admin_client, create_topic
    from streaming.job import DelayJob
    from streaming.session import build_session
    from tests.support import free_ports

    home = Path(tempfile.mkdtemp(prefix="delayq-bench-"))
    ports = free_ports(2)
    spec = broker.BrokerSpec(home=home / "kafka", jars=PROJECT / ".lib" / "kafka",
                             port=ports[0], controller_port=ports[1], heap="1g")
    broker.start(spec)
    try:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(bootstrap_servers=spec.bootstrap, data_dir=str(home / "data"),
                                 delay_levels="1s 2s 3s", intake_topic=f"bench-{tag}",
                                 dlq_topic=f"bench-{tag}.DLQ", spark_master="local[2]",
                                 spark_driver_memory="4g")
        admin = admin_client(settings)
        real = "bench-near"
        create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
        create_topic(admin, "bench-far", 2)
        spark = build_session(settings)
        summaries = []
        job = DelayJob(settings, spark, checkpoint=str(home / "ckpt"), on_batch=summaries.append)
        job.start()
        time.sleep(10)  # warm-up
        print("phase A: near load, no backlog", flush=True)
        before = near_load(settings, real, args.seconds, args.rate, job)
        print(json.dumps(before), flush=True)

        print(f"phase B: {args.backlog} far-future timers", flush=True)
        produce_s = backlog(settings, args.backlog)
        t0 = time.time()
        while sum(s.count("cold") for s in summaries) < args.backlog and time.time() - t0 < 1800:
            time.sleep(2)
        ingest_s = time.time() - t0
        parked = sum(s.count("cold") for s in summaries)
        print(f"produced in {produce_s:.1f} s, parked {parked} in {ingest_s:.1f} s", flush=True)
        time.sleep(10)

        print("phase C: near load with the backlog pending", flush=True)
        after = near_load(settings, real, args.seconds, args.rate, job)
        print(json.dumps(after), flush=True)
        cold_bytes, state_bytes = du(settings.cold_path), du(home / "ckpt" / "state")
        result = {
            "backlog": args.backlog, "parked": parked, "produce_s": round(produce_s, 1),
            "ingest_s": round(ingest_s, 1), "without_backlog": before, "with_backlog": after,
            "batch_median_ratio": round(after["batch_median_ms"] / before["batch_median_ms"], 3),
            "lateness_p50_ratio": round(after["lateness_p50_ms"] / max(1, before["lateness_p50_ms"]), 3),
            "lateness_p99_ratio": round(after["lateness_p99_ms"] / max(1, before["lateness_p99_ms"]), 3),
            "cold_tier_bytes": cold_bytes,
            "cold_bytes_per_message": round(cold_bytes / max(1, parked), 1),
            "payload_bytes": 256, "wheel_state_bytes": state_bytes,
        }
        print(json.dumps(result, indent=2))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        job.stop()
        spark.stop()
    finally:
        broker.stop(spec)


if __name__ == "__main__":
    main()
