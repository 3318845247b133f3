"""One dispatch task's read-back alone (no Spark): `--count` references to 1 KiB intake
records on the ready partition, all due `--due-in-s` from the load's end, and the task in a
process of its own. Prints how long until every message was on its real topic, the task's CPU
per message, and when the first and last were sent against their due time.

    .venv/bin/delayq kafka start
    .venv/bin/python -m streaming.tools.bench_readback --count 200000 --due-in-s 0
    .venv/bin/python -m streaming.tools.bench_readback --count 200000 --due-in-s 30
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import uuid
from dataclasses import replace

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conf import load_settings
from streaming.dispatch.task import run_partition
from streaming.stages import dispatch_config
from streaming.stages import rules_of

LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def _produce(producer: Producer, topic: str, **record) -> None:
    while True:
        try:
            producer.produce(topic, partition=0, **record)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.05)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--bootstrap", default="127.0.0.1:9092")
    args.add_argument("--count", type=int, default=200_000)
    args.add_argument("--due-in-s", type=float, default=0.0)
    opts = args.parse_args()
    tag = uuid.uuid4().hex[:6]
    names = {k: f"readback-{k}-{tag}" for k in ("intake", "ready", "ledger", "real", "dlq")}
    admin = AdminClient({"bootstrap.servers": opts.bootstrap})
    for done in admin.create_topics([NewTopic(t, 1, 1, config={} if k == "ready" else LOG_APPEND)
                                     for k, t in names.items()]).values():
        done.result(30)
    producer = Producer({"bootstrap.servers": opts.bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    appended = []
    body = os.urandom(512).hex().encode()
    for i in range(opts.count):
        _produce(producer, names["intake"], key=b"%d" % i, value=body, headers=[
            ("REAL_TOPIC", names["real"].encode()), ("DELAY", b"4"), ("UNIQ_KEY", b"u%d" % i)],
            on_delivery=lambda err, msg: appended.append(
                (msg.offset(), msg.timestamp()[1], int(msg.key()))))
    producer.flush(120)
    due = int((time.time() + opts.due_in_s) * 1000)
    for offset, append_ms, i in sorted(appended):   # as sinks/ready.py reference_value
        _produce(producer, names["ready"], key=b"0",   # one wheel batch
                 value=f"{due},4,0,{offset},{append_ms},u{i}".encode())
    producer.flush(120)

    settings = load_settings(intake_topic=names["intake"], dlq_topic=names["dlq"])
    config = replace(
        dispatch_config(settings, "run-1", 1_048_576, 1, {}, 1_048_588,
                        rules=rules_of(settings, "")), ring=None,
        consumer={"bootstrap.servers": opts.bootstrap, "group.id": f"readback-{tag}"},
        producer={"bootstrap.servers": opts.bootstrap, "linger.ms": 1, "acks": "all",
                  "enable.idempotence": True, "message.max.bytes": 1_048_576},
        ready_topic=names["ready"], ledger_topic=names["ledger"], dlq_topic=names["dlq"],
        intake_topic=names["intake"], direct_max_delay_ms=-1)
    task = multiprocessing.get_context("fork").Process(
        target=lambda: list(run_partition(config, 0)), daemon=True)
    began = time.time()
    task.start()
    reader = Consumer({"bootstrap.servers": opts.bootstrap, "group.id": f"readback-{tag}-end"})
    ends = lambda: sum(reader.get_watermark_offsets(TopicPartition(names[k], 0), timeout=10)[1]
                       for k in ("real", "dlq"))
    first = None
    while (sent := ends()) < opts.count and time.time() - began < 600:
        first = first or (time.time() if sent else None)
        time.sleep(0.1)
    ended, cpu_s = time.time(), _cpu_s(task.pid)
    task.kill()
    print(f"{sent} of {opts.count} sent in {ended - began:.1f} s ({sent / (ended - began):,.0f} "
          f"msg/s); the task's CPU {cpu_s:.1f} s, {cpu_s / opts.count * 1e6:.0f} µs a message; "
          f"first {((first or ended) * 1000 - due) / 1000:+.1f} s, last "
          f"{(ended * 1000 - due) / 1000:+.1f} s from the due time")


if __name__ == "__main__":
    main()
