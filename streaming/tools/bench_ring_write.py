"""What a dispatch task's ring writes cost the broker (conf's ring_write_ms): a transactional
producer, committing every 50 ms as a task does, writes `--rate` timers a second spread over
`--partitions` ring partitions, either in every transaction or gathered and written every
`--write-ms`. Prints, for each cadence in turn, the broker's CPU and this process's.

    .venv/bin/delayq kafka start
    .venv/bin/python -m streaming.tools.bench_ring_write --write-ms 50 1000 50 1000
"""
from __future__ import annotations

import argparse
import random
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conf.settings import load_settings
from streaming.tools.bench_readback import _cpu_s
from streaming.tools.broker import read_pid, spec_from_settings

TRANSACTION_S = 0.05


def run(bootstrap: str, broker: int, rate: int, partitions: int, write_ms: int,
        seconds: float) -> tuple[str, str, int]:
    """One cadence against the broker of pid `broker`: the line it prints, and its topic and the
    timers it wrote."""
    topic = f"ring-write-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic,
                         "linger.ms": 1})
    producer.init_transactions(30)
    producer.begin_transaction()
    body, gathered, written = b"x" * 200, [], 0
    broker_cpu, cpu, began = _cpu_s(broker), time.process_time(), time.monotonic()
    wrote_at = began
    while (now := time.monotonic()) - began < seconds:
        gathered += [random.randrange(partitions)
                     for _ in range(int((now - began) * rate) - written - len(gathered))]
        if (now - wrote_at) * 1000 >= write_ms:
            for part in gathered:
                producer.produce(topic, body, b"k", part)
            written, gathered, wrote_at = written + len(gathered), [], now
        producer.commit_transaction(30)
        producer.begin_transaction()
        time.sleep(max(0.0, TRANSACTION_S - (time.monotonic() - now)))
    took = time.monotonic() - began
    producer.commit_transaction(30)
    return (f"written every {write_ms} ms: {written / took:,.0f} timers/s over {partitions} "
            f"partitions; in {took:.0f} s the broker used {_cpu_s(broker) - broker_cpu:.1f} "
            f"CPU-s, the producer {time.process_time() - cpu:.1f}"), topic, written


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--bootstrap", default="127.0.0.1:9092")
    args.add_argument("--rate", type=int, default=2_500, help="one task's share of 5,000/s")
    args.add_argument("--partitions", type=int, default=62)
    args.add_argument("--seconds", type=float, default=30)
    args.add_argument("--write-ms", type=int, nargs="+", default=[50, 1000, 50, 1000])
    opts = args.parse_args()
    broker = read_pid(spec_from_settings(load_settings()))
    for write_ms in opts.write_ms:
        line, *_ = run(opts.bootstrap, broker, opts.rate, opts.partitions, write_ms, opts.seconds)
        print(line, flush=True)


if __name__ == "__main__":
    main()
