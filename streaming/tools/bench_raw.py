"""The bench's raw pipe: the intake copied to a topic by a plain Spark Kafka query with the
job's Kafka options, trigger and batch bound (no parse, no state, no dispatch), the baseline
every delayq figure is compared with in the same run: `raw` drains a preloaded backlog,
`raw-steady` carries the steady scenario's load.
"""
from __future__ import annotations

import time

from streaming.tools.bench_figures import (after_warmup, batch_figures, last_batch, last_delivery_ms,
                                     processing_rate, timeline)
from streaming.tools.bench_load import Load, fresh_topic


def raw_query(bench, intake: str, real: str, name: str):
    """The raw pipe: `intake` copied to `real` by a plain Spark Kafka query with the job's
    Kafka options, trigger and batch bound (no parse, no state, no hold)."""
    from pyspark.sql import functions as F

    from sinks.kafka import producer_options
    from streaming.kafka.config import spark_options

    options = spark_options(bench.settings)
    reader = (bench.spark.readStream.format("kafka").options(**options)
              .option("subscribe", intake).option("startingOffsets", "earliest")
              .option("includeHeaders", "true"))
    if bench.settings.max_offsets_per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", bench.settings.max_offsets_per_trigger)
    return (reader.load()
            .select(F.lit(real).alias("topic"), "key", "value", "headers")
            .writeStream.format("kafka").options(**{**producer_options(bench.settings), **options})
            .option("checkpointLocation", str(bench.work / f"{name}-ckpt"))
            .trigger(processingTime="0 seconds").start())

def raw(bench) -> dict:
    intake, real = fresh_topic(bench.admin, "bench-raw-in", 1), fresh_topic(bench.admin, "bench-raw-out")
    load = Load(bench.settings, bench.work, real, "raw")
    load.start_reader(timeout_s=600)
    # Level 0: the raw pipe's due time is the append time itself.
    load.produce(intake, bench.plan.drain, 0, bench.plan.size, levels=(0,))
    query = raw_query(bench, intake, real, "raw")
    try:
        figures = load.finish(bench.plan.drain)
        figures.update(processing_rate(query, -1, last_delivery_ms(figures)))
    finally:
        query.stop()
    # The raw pipe has no due time: its "lateness" is the copy's delay after append.
    return figures

def raw_steady(bench) -> dict:
    """The raw pipe under the steady scenario's load (rate, seconds, warm-up, levels, one
    intake partition per level): its transit, from the intake's append to the copy's, is
    the least time any Spark micro-batch job on this host and trigger takes to read a
    message and write it again at that rate. A level's lateness in delayq can be no lower
    than that transit minus the level's delay, so this measures the floor under the
    steady scenario's lateness in the same run ("lateness" here is the transit)."""
    plan = bench.plan
    partitions = max(1, *plan.levels)   # one per level, as the intake; level 0 too
    intake = fresh_topic(bench.admin, "bench-raw-steady-in", partitions)
    real = fresh_topic(bench.admin, "bench-raw-steady-out")
    load = Load(bench.settings, bench.work, real, "raw-steady")
    count = int(plan.rate * (plan.warmup_s + plan.seconds))
    load.start_reader(timeout_s=plan.warmup_s + plan.seconds + 600)
    query = raw_query(bench, intake, real, "raw-steady")
    try:
        # The steady load's levels and partitions, each due at its append: a transit.
        produced = load.produce(intake, count, plan.rate, plan.size, levels=plan.levels,
                                partitions=partitions, wait=False, no_delay=True)
        after = -1
        if plan.warmup_s:
            time.sleep(plan.warmup_s)
            after = last_batch(query)
        done = load.wait_producer(produced)
        figures = load.finish(count)
        if plan.warmup_s:
            figures.update(after_warmup(figures, plan.warmup_s))
        figures.update(in_msg_s=done["rate"], **batch_figures(query, after))
        figures["timeline"] = timeline(query, after, [])
    finally:
        query.stop()
    return figures
