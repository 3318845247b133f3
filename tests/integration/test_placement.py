"""Where Spark runs a wheel group and a hold task's rows, checked against Spark itself
(state/placement.py, sinks/kafka.py `hold_lane`)."""
from __future__ import annotations

import random
import time
import uuid

from pyspark.sql import functions as F

from sinks.kafka import hold_lane
from state.placement import partition_of, spark_hash_int, task_keys
from state.wheel import TIMER_PARTS, part_of
from streaming.admin import ensure_topics
from streaming.job import wheel_stream
from streaming.producer import DelayProducer


def test_placement_is_spark_s_hash_partitioning(spark):
    rng = random.Random(7)
    keys = [(rng.randint(-3, 18), rng.randint(-2**40, 2**40)) for _ in range(2_000)]
    keys += [(0, s) for s in range(16)]
    for partitions in (2, 3, 7):
        placed = (spark.createDataFrame(keys, "bucket int, slot long")
                  .repartition(partitions, "bucket", "slot")
                  .select("bucket", "slot", F.spark_partition_id().alias("p")).collect())
        wrong = [(r.bucket, r.slot, r.p) for r in placed
                 if r.p != partition_of(r.bucket, r.slot, partitions)]
        assert not wrong, f"{partitions} partitions: {wrong[:5]}"


def test_task_keys_are_spark_s_hash_partitioning_of_an_int(spark):
    values = list(range(-50, 200)) + [2**31 - 1, -2**31]
    for tasks in (2, 3, 8):
        placed = (spark.createDataFrame([(v,) for v in values], "v int")
                  .repartition(tasks, "v").select("v", F.spark_partition_id().alias("p")).collect())
        assert all(r.p == spark_hash_int(r.v) % tasks for r in placed), tasks
        keys = task_keys(tasks)
        placed = (spark.createDataFrame([(k,) for k in keys], "v int")
                  .repartition(tasks, "v").select("v", F.spark_partition_id().alias("p")).collect())
        assert sorted((keys.index(r.v), r.p) for r in placed) == [(i, i) for i in range(tasks)]


def test_the_hold_s_lanes(spark):
    """Rows whose order Kafka keeps share a task: those to one named partition, those to a
    topic's only partition, those of one key; rows without either to a topic of several
    partitions, and a topic's partitions, spread over the tasks."""
    rows = ([("multi", p, None, f"p{p}-{i}") for p in range(4) for i in range(50)]
            + [("multi", None, f"k{k}".encode(), f"k{k}-{i}") for k in range(20) for i in range(10)]
            + [("multi", None, None, f"u{i}") for i in range(400)]
            + [("single", None, None, f"s{i}") for i in range(100)]
            + [("single", None, b"k", f"sk{i}") for i in range(10)]
            + [("unknown", None, None, f"x{i}") for i in range(400)])
    frame = spark.createDataFrame(rows, "topic string, partition int, key binary, uniq_key string")
    tasks = 2
    lane = hold_lane({"multi": 4, "single": 1}, tasks)
    placed = (frame.repartition(tasks, lane)
              .select("topic", "partition", "key", "uniq_key", F.spark_partition_id().alias("t"))
              .collect())
    assert len(placed) == len(rows)
    task_of: dict = {}
    for r in placed:
        if r.partition is not None:
            task_of.setdefault(("partition", r.partition), set()).add(r.t)
        elif r.topic == "single":
            task_of.setdefault(("single",), set()).add(r.t)
        elif r.key is not None:
            task_of.setdefault(("key", r.key), set()).add(r.t)
        else:
            task_of.setdefault((r.topic,), set()).add(r.t)
    one_task = {k: v for k, v in task_of.items() if k[0] in ("partition", "single", "key")}
    assert all(len(v) == 1 for v in one_task.values()), one_task
    assert [next(iter(task_of[("partition", p)])) for p in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])
    assert len(set.union(*(task_of[("key", f"k{k}".encode())] for k in range(20)))) == 2
    for topic in ("multi", "unknown"):
        spread = [r.t for r in placed if r.topic == topic and r.partition is None and r.key is None]
        assert 120 < sum(spread) < 280, (topic, sum(spread), len(spread))


def test_immediate_messages_are_spread_over_every_state_partition(spark, job_settings, work_dir):
    """The wheel's own output, tagged with the partition its stateful task ran in: each
    immediate message leaves from the state partition its intake offset picks, so from both
    (they all left from partition 1 when they were spread by intake offset modulo 2)."""
    settings = job_settings()
    assert settings.spark_shuffle_partitions == 2
    ensure_topics(settings)
    count = 40
    with DelayProducer(settings) as producer:
        handles = [producer.send("anywhere", f"now {i}".encode(), partition=0)
                   for i in range(count)]
    seen: list = []

    def collect(batch, _batch_id):
        seen.extend(batch.filter(F.col("kind") == "deliver")
                    .select("uniq_key", F.spark_partition_id().alias("p")).collect())

    query = (wheel_stream(spark, settings).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(work_dir / f"ckpt-{uuid.uuid4().hex[:8]}"))
             .trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 120
        while len(seen) < count and time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert sorted(r.uniq_key for r in seen) == sorted(h.uniq_key for h in handles)
    wanted = {h.uniq_key: h.offset % 2 for h in handles}
    assert {r.uniq_key: r.p for r in seen} == wanted
    assert set(wanted.values()) == {0, 1}


def test_a_second_s_timers_leave_the_wheel_from_both_state_partitions(spark, job_settings, work_dir):
    """Timers due in one second are TIMER_PARTS wheel groups, numbered so that Spark runs
    parts 0, 2, 4, 6 on state partition 0 and 1, 3, 5, 7 on partition 1: a burst is released
    by both tasks, half each. The query's first watermark is set past their due time, so they
    fire in its first batch, from the task that holds them."""
    settings = job_settings()
    assert settings.spark_shuffle_partitions == 2
    ensure_topics(settings)
    due_ms = (int(time.time()) + 60) * 1_000 + 500
    with DelayProducer(settings) as producer:
        handles = [producer.send("anywhere", f"timer {i}".encode(), deliver_at_ms=due_ms)
                   for i in range(64)]
    assert {part_of(h.uniq_key, TIMER_PARTS) for h in handles} == set(range(TIMER_PARTS))
    seen: list = []

    def collect(batch, _batch_id):
        seen.extend(batch.filter(F.col("kind") == "deliver")
                    .select("uniq_key", F.spark_partition_id().alias("p")).collect())

    query = (wheel_stream(spark, settings, first_watermark_ms=due_ms + 60_000)
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(work_dir / f"ckpt-{uuid.uuid4().hex[:8]}"))
             .trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 120
        while len(seen) < len(handles) and time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert sorted(r.uniq_key for r in seen) == sorted(h.uniq_key for h in handles)
    wanted = {h.uniq_key: part_of(h.uniq_key, TIMER_PARTS) % 2 for h in handles}
    assert {r.uniq_key: r.p for r in seen} == wanted
