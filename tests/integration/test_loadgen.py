"""The bench's load generator and reader on the real broker: two loads on one topic (the
restart scenario's load and its outage's backlog), each reader counting only its own."""
from __future__ import annotations

import numpy as np
import pytest

from streaming.tools.bench_load import Load

pytestmark = pytest.mark.integration


def test_two_loads_on_one_topic_each_read_only_their_own(test_settings, new_topic, tmp_path):
    topic = new_topic(partitions=2, message_timestamp_type="LogAppendTime")
    first = Load(test_settings, tmp_path, topic, "first")
    second = Load(test_settings, tmp_path, topic, "second", seq_base=300)
    first.start_reader(timeout_s=120, idle_s=10, count=300)
    second.start_reader(timeout_s=120, idle_s=10, count=200)
    # Level 0 straight into the topic the readers read: no job in between.
    first.produce(topic, 300, 0, 64, levels=(0,))
    second.produce(topic, 200, 0, 64, levels=(0,))

    mine, theirs = first.finish(300), second.finish(200)

    assert (mine["messages"], mine["delivered"], mine["duplicates"]) == (300, 300, 0)
    assert (theirs["messages"], theirs["delivered"], theirs["duplicates"]) == (200, 200, 0)
    assert mine["early"] == 0 and theirs["early"] == 0
    # What each reader kept: its own range only, numbered from 0.
    for load, count in ((first, 300), (second, 200)):
        kept = np.load(load.out + "-read.npz")["seq"]
        assert len(kept) == count and kept.min() == 0 and kept.max() == count - 1


def test_scattered_timers_carry_their_own_delay_and_are_due_that_long_after_their_append(
        test_settings, new_topic, tmp_path):
    """The scattered scenario's load: each timer a TIMER_DELAY_MS of its own, drawn below the
    spread, and recorded as due that long after the broker appended it."""
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(partitions=2, message_timestamp_type="LogAppendTime")
    load = Load(test_settings, tmp_path, topic, "scattered")
    load.produce(topic, 400, 0, 64, partitions=2, delay_spread_ms=60_000)

    sent = np.load(load.out + "-sent.npz")
    consumer = Consumer({"bootstrap.servers": test_settings.bootstrap, "group.id": "t",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    delays = {}
    while len(delays) < 400:
        for msg in consumer.consume(500, timeout=10):
            headers = dict(msg.headers())
            assert "DELAY" not in headers and "TIMER_DELIVER_MS" not in headers
            seq = int.from_bytes(msg.value()[:8], "big")
            delays[seq] = (int(headers["TIMER_DELAY_MS"]), msg.timestamp()[1])
    consumer.close()
    delay = np.array([delays[i][0] for i in range(400)])
    assert delay.min() >= 0 and delay.max() < 60_000 and len(set(delay)) > 300
    assert (sent["level"] == -1).all()
    assert (sent["append"] == [delays[i][1] for i in range(400)]).all()
    assert (sent["due"] == sent["append"] + delay).all()
