"""The benchmark's load generator and reader, each run as a child process so that neither
takes the driver's Python (and its GIL) from the job it measures. Both use librdkafka
(confluent-kafka): a pure-Python client would spend the cores it is measuring.

    python -m streaming.tools.loadgen produce --bootstrap B --intake T --real R --count N ...
    python -m streaming.tools.loadgen consume --bootstrap B --topic R --out F.npz ...

A message's value starts with its sequence number (8 bytes, big-endian); the producer records
each one's broker append time and due time, the reader each delivery's broker timestamp, and
the bench joins them on the sequence number. Two loads may share a real topic: the second
numbers its messages from `--seq-base` on, and each reader keeps only its own range
(`--seq-base`, `--seq-count`), numbered from 0 again.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

SEQ = 8


def client_config(args) -> dict:
    config = {"bootstrap.servers": args.bootstrap}
    security = json.loads(os.environ.get("DELAYQ_BENCH_SECURITY", "{}"))
    config.update(security)
    return config


def produce(args) -> None:
    from confluent_kafka import Producer

    delays = [int(d) for d in args.delays.split(",")] if args.delays else []
    levels = [int(v) for v in args.levels.split(",")] if args.levels else []
    n = args.count
    append = np.full(n, -1, dtype=np.int64)
    failed = 0
    pad = os.urandom(max(0, args.size - SEQ))
    producer = Producer({**client_config(args), "linger.ms": 5, "batch.size": 1 << 20,
                         "acks": "all", "queue.buffering.max.messages": 2_000_000,
                         "queue.buffering.max.kbytes": 2 << 20, "enable.idempotence": False})

    def delivered(err, msg):
        nonlocal failed
        seq = int.from_bytes(msg.value()[:SEQ], "big") - args.seq_base
        if err is not None:
            failed += 1
        else:
            append[seq] = msg.timestamp()[1]

    level_of = np.array(levels or [0], dtype=np.int64)
    # Timers due over a span (a backlog): each message's own deliver time, drawn up front.
    timer_due = (args.deliver_at_ms + np.random.default_rng(0).integers(
        0, args.deliver_spread_ms, n, dtype=np.int64)) if args.deliver_spread_ms else None
    # Timers each due its own delay after its append (TIMER_DELAY_MS), uniform over the spread.
    timer_delay = np.random.default_rng(1).integers(
        0, args.timer_delay_spread_ms, n, dtype=np.int64) if args.timer_delay_spread_ms else None
    mix = TimerMix(n, args.timer_mix_ms) if args.timer_mix_ms else None
    started = time.time()
    i = 0
    while i < n:
        # Keep to the rate: send what is owed now, then yield to the delivery reports.
        owed = n if args.rate <= 0 else min(n, int((time.time() - started) * args.rate) + 1)
        while i < owed:
            headers, part = (mix.addressed(args, i) if mix else
                             _addressed(args, i, level_of, timer_due, timer_delay))
            # Random bodies where asked: one repeated body would compress away in the cold
            # tier's Parquet files and understate the bytes kept per message.
            body = os.urandom(args.size - SEQ) if args.random_bodies else pad
            try:
                producer.produce(args.intake, value=(args.seq_base + i).to_bytes(SEQ, "big") + body,
                                 partition=part,
                                 headers=headers, on_delivery=delivered)
                i += 1
            except BufferError:
                producer.poll(0.05)
                continue
            if i % 2000 == 0:
                producer.poll(0)
        producer.poll(0.005 if args.rate > 0 else 0)
    producer.flush(120)
    _record(args, time.time() - started, append, delays, level_of, timer_due, failed,
            timer_delay, mix)


class TimerMix:
    """Timers in every header form (the `timers` scenario): a tenth in the past by up to 30 s
    (TIMER_DELIVER_MS), a tenth due within 3 s, the rest within `spread_ms`; the others in turn
    as TIMER_DELIVER_MS, TIMER_DELAY_MS and TIMER_DELAY_SEC (whole seconds)."""

    def __init__(self, n: int, spread_ms: int):
        rng = np.random.default_rng(2)
        band = rng.integers(0, 10, n)
        self.delay = np.where(band == 0, rng.integers(-30_000, 0, n),
                              np.where(band == 1, rng.integers(0, 3_000, n),
                                       rng.integers(3_000, spread_ms, n))).astype(np.int64)
        self.form = np.where(band == 0, 0, np.arange(n) % 3)   # 0 deliver, 1 ms, 2 seconds
        self.delay[self.form == 2] -= self.delay[self.form == 2] % 1000
        self.at = np.zeros(n, np.int64)   # TIMER_DELIVER_MS: the producer's clock + delay

    def addressed(self, args, i: int) -> tuple[list, int]:
        uniq = f"{args.run}-{i}"
        headers = [("REAL_TOPIC", args.real.encode()), ("UNIQ_KEY", uniq.encode())]
        if self.form[i] == 0:
            self.at[i] = int(time.time() * 1000) + self.delay[i]
            headers.append(("TIMER_DELIVER_MS", str(self.at[i]).encode()))
        elif self.form[i] == 1:
            headers.append(("TIMER_DELAY_MS", str(self.delay[i]).encode()))
        else:
            headers.append(("TIMER_DELAY_SEC", str(self.delay[i] // 1000).encode()))
        return headers, zlib.crc32(uniq.encode()) % args.partitions   # as DelayProducer does

    def due(self, append: np.ndarray) -> np.ndarray:
        return np.where(self.form == 0, np.maximum(append, self.at), append + self.delay)


def _addressed(args, i: int, level_of: np.ndarray, timer_due,
               timer_delay) -> tuple[list, int]:
    """Message `i`'s headers and intake partition: a timer (its own due time or delay, or the
    burst's due time) or a level message, on its level's partition."""
    headers = [("REAL_TOPIC", args.real.encode()), ("UNIQ_KEY", f"{args.run}-{i}".encode())]
    if timer_delay is not None:
        headers.append(("TIMER_DELAY_MS", str(timer_delay[i]).encode()))
        return headers, i % args.partitions
    if timer_due is not None:
        headers.append(("TIMER_DELIVER_MS", str(timer_due[i]).encode()))
        return headers, i % args.partitions
    if args.deliver_at_ms:
        headers.append(("TIMER_DELIVER_MS", str(args.deliver_at_ms).encode()))
        return headers, i % args.partitions
    level = int(level_of[i % len(level_of)])
    headers.append(("DELAY", str(level).encode()))
    return headers, (level - 1) % args.partitions


def _record(args, elapsed: float, append: np.ndarray, delays: list[int], level_of: np.ndarray,
            timer_due, failed: int, timer_delay=None, mix: TimerMix | None = None) -> None:
    """Each message's append and due time and level (`args.out`.npz), then the `.done` file."""
    n = len(append)
    timers = args.deliver_at_ms or timer_delay is not None or mix is not None
    level_per_seq = (np.full(n, -1, dtype=np.int64) if timers
                     else level_of[np.arange(n) % len(level_of)].astype(np.int64))
    if mix is not None:
        due = mix.due(append)
    elif timer_delay is not None:
        due = append + timer_delay
    elif timer_due is not None:
        due = np.maximum(append, timer_due)
    elif args.deliver_at_ms:
        due = np.maximum(append, args.deliver_at_ms)
    else:
        due = append + np.array([0, *delays], dtype=np.int64)[level_per_seq]
    np.savez(args.out, append=append, due=due, level=level_per_seq)
    Path(args.out + ".done").write_text(json.dumps(
        {"count": n, "failed": failed, "seconds": round(elapsed, 3),
         "rate": round(n / elapsed, 1) if elapsed else None}))


def consume(args) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client_config(args), "group.id": f"delayq-bench-{os.getpid()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.min.bytes": 1, "fetch.wait.max.ms": 50})
    meta = consumer.list_topics(args.topic, timeout=30).topics[args.topic]
    consumer.assign([TopicPartition(args.topic, p, 0) for p in meta.partitions])
    seqs, stamps, seen_ms = [], [], []
    expected_file = Path(args.out + ".expected")
    stop_file = Path(args.out + ".stop")
    expected = None
    seen: set[int] = set()
    idle_since = time.time()
    deadline = time.time() + args.timeout
    while time.time() < deadline and not stop_file.exists():
        batch = consumer.consume(num_messages=10_000, timeout=0.01)   # `seen` within 10 ms
        now_ms = int(time.time() * 1000)   # when this reader (read_committed) saw them
        for msg in batch:
            if msg.error() is not None:
                continue
            seq = int.from_bytes(msg.value()[:SEQ], "big") - args.seq_base
            if seq < 0 or (args.seq_count and seq >= args.seq_count):
                continue   # another load's message on a shared topic
            seqs.append(seq)
            stamps.append(msg.timestamp()[1])
            seen_ms.append(now_ms)
            seen.add(seq)
        if batch:
            idle_since = time.time()
        if expected is None and expected_file.exists():
            told = json.loads(expected_file.read_text())
            expected, quiet_from = told["expected"], told["quiet_from_s"]
        if expected is None:
            continue
        # Idle counts only once every message is due (and the bench has said how many).
        quiet = time.time() - max(idle_since, quiet_from)
        if len(seen) >= expected or quiet > args.idle:
            break
    consumer.close()
    np.savez(args.out, seq=np.array(seqs, dtype=np.int64), ts=np.array(stamps, dtype=np.int64),
             seen=np.array(seen_ms, dtype=np.int64))
    Path(args.out + ".done").write_text(json.dumps({"records": len(seqs), "distinct": len(seen)}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streaming.tools.loadgen")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--intake", required=True)
    p.add_argument("--real", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, default=0.0, help="msg/s; 0: as fast as possible")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--levels", default="1", help="levels, round robin (1-based)")
    p.add_argument("--delays", default="", help="delay of each level in ms, comma separated")
    p.add_argument("--deliver-at-ms", type=int, default=0, help="timers all due at this time")
    p.add_argument("--deliver-spread-ms", type=int, default=0,
                   help="timers due uniformly over [deliver-at, deliver-at + spread)")
    p.add_argument("--timer-delay-spread-ms", type=int, default=0,
                   help="timers due uniformly over [0, spread) ms after their append")
    p.add_argument("--timer-mix-ms", type=int, default=0,
                   help="timers of every header form, past and due within this (TimerMix)")
    p.add_argument("--random-bodies", action="store_true", help="a random body per message")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--run", default="bench")
    p.add_argument("--seq-base", type=int, default=0, help="the first message's sequence number")
    p.add_argument("--out", required=True)
    c = sub.add_parser("consume")
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--timeout", type=float, default=900.0)
    c.add_argument("--idle", type=float, default=20.0)
    c.add_argument("--seq-base", type=int, default=0, help="the load's first sequence number")
    c.add_argument("--seq-count", type=int, default=0,
                   help="the load's messages; others on the topic are skipped (0: all from the base)")
    c.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    (produce if args.command == "produce" else consume)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
