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
