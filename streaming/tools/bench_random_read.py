"""What a reference costs when its record is a random read of the intake (the `scattered`
scenario's worst case): `--records` 1 KiB records in small producer batches, then `--reads`
random offsets, sorted, each read alone by positioning a consumer there, by `--consumers`
consumers in threads. Prints reads a second and this process's CPU a read.

    .venv/bin/delayq kafka start
    .venv/bin/python -m streaming.tools.bench_random_read --consumers 1
    .venv/bin/python -m streaming.tools.bench_random_read --consumers 4
"""
from __future__ import annotations

import argparse
import os
import random
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def _load(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "batch.num.messages": 10})   # batches of a 5,000 msg/s intake
    body = os.urandom(512).hex().encode()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=body, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


def _read(bootstrap: str, topic: str, offsets: list[int], done: list) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"random-{uuid.uuid4()}",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 5,
                         "max.partition.fetch.bytes": 65_536})
    for offset in offsets:
        consumer.assign([TopicPartition(topic, 0, offset)])
        while not any(m.error() is None and m.offset() == offset
                      for m in consumer.consume(100, timeout=1)):
            pass
    done.append(len(offsets))
    consumer.close()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--bootstrap", default="127.0.0.1:9092")
    args.add_argument("--records", type=int, default=300_000)
    args.add_argument("--reads", type=int, default=5_000)
    args.add_argument("--consumers", type=int, default=1)
    opts = args.parse_args()
    topic = f"random-read-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": opts.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    _load(opts.bootstrap, topic, opts.records)
    offsets = sorted(random.randrange(opts.records) for _ in range(opts.reads))
    done: list = []
    threads = [threading.Thread(target=_read, args=(opts.bootstrap, topic,
                                                    offsets[i::opts.consumers], done))
               for i in range(opts.consumers)]
    cpu, began = time.process_time(), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took, cpu = time.monotonic() - began, time.process_time() - cpu
    print(f"{sum(done)} random reads by {opts.consumers} consumer(s) in {took:.1f} s: "
          f"{sum(done) / took:,.0f} reads/s, {cpu / sum(done) * 1e6:,.0f} µs of CPU a read")


if __name__ == "__main__":
    main()
