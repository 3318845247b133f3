"""Where Spark runs a wheel group, checked against Spark itself (state/placement.py)."""
from __future__ import annotations

import random
import time
import uuid

import pytest
from pyspark.sql import functions as F

from state.placement import partition_of
from state.wheel import part_of
from streaming.kafka.admin import ensure_topics
from streaming.stages import rules_of, wheel_config_of
from streaming.wheel.query import intake_stream, wheel_stream
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


def test_immediate_messages_are_spread_over_every_state_partition(spark, job_settings, work_dir):
    """The wheel's own output, tagged with the partition its stateful task ran in: each
    immediate message leaves from the state partition its intake offset picks, so from both
    (they all left from partition 1 when they were spread by intake offset modulo 2). Every
    level through the wheel: the dispatch tasks would read immediate messages themselves."""
    settings = job_settings(dispatch_direct_max_delay_ms=-1)
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

    query = (wheel_stream(intake_stream(spark, settings), rules_of(settings, ""),
                          wheel_config_of(settings)).writeStream.foreachBatch(collect)
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


@pytest.mark.parametrize("parts", [8, 3])
def test_a_second_s_timers_leave_the_wheel_from_both_state_partitions(spark, job_settings, work_dir,
                                                                       parts):
    """Timers due in one second are `timer_parts` wheel groups g = second * parts + part, numbered
    so that Spark runs group g on state partition g % 2: a burst is released by both tasks (half
    each with 8 parts). The query's first watermark is set past their due time, so they
    fire in its first batch, from the task that holds them."""
    settings = job_settings(timer_parts=parts)
    assert settings.spark_shuffle_partitions == 2
    ensure_topics(settings)
    due_ms = (int(time.time()) + 60) * 1_000 + 500
    # UNIQ_KEYs that fill every part alike: 64 random ones left one of 8 parts out about once in
    # 700 runs, and then its task released none.
    by_part: dict[int, list[str]] = {part: [] for part in range(parts)}
    for i in range(10_000):
        keys = by_part[part_of(f"timer-{i}", parts)]
        keys.extend([f"timer-{i}"] if len(keys) < 64 // parts else [])
    with DelayProducer(settings) as producer:
        handles = [producer.send("anywhere", key.encode(), deliver_at_ms=due_ms, uniq_key=key)
                   for keys in by_part.values() for key in keys]
    assert len(handles) == parts * (64 // parts)
    seen: list = []

    def collect(batch, _batch_id):
        seen.extend(batch.filter(F.col("kind") == "deliver")
                    .select("uniq_key", F.spark_partition_id().alias("p")).collect())

    query = (wheel_stream(intake_stream(spark, settings), rules_of(settings, ""),
                          wheel_config_of(settings, first_watermark_ms=due_ms + 60_000))
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
    wanted = {h.uniq_key: (due_ms // 1_000 * parts + part_of(h.uniq_key, parts)) % 2
              for h in handles}
    assert {r.uniq_key: r.p for r in seen} == wanted
