"""What the job's Kafka writes share: the Spark Kafka writer's producer options, the header
column Spark's Kafka sink takes, and the per-row counting a write does in its own Spark job
(sinks/ready.py), reported to the driver through an accumulator."""
from __future__ import annotations

import pyarrow as pa
from pyspark import AccumulatorParam
from pyspark.sql import functions as F

# linger 1 ms: a row on its own leaves at once; batches of up to 256 KiB per partition (the
# Java client's default is 16 KiB): a burst, a drain or a catch-up goes out in fewer, larger
# batches. A burst of 500,000 was written in 37-39 s in five runs against 49-59 s with the
# default (docs/benchmarks.md, "The Kafka writer's batch size").
PRODUCER_OPTIONS = {"kafka.linger.ms": "1", "kafka.acks": "all", "kafka.max.block.ms": "30000",
                    "kafka.batch.size": str(256 * 1024)}
# What a write counts a batch's rows by (the summary's counts, sinks/base.py).
COUNTED_BY = ("kind", "topic", "partition", "level", "reason")
# What the Kafka writer takes.
KAFKA_COLUMNS = ("topic", "partition", "key", "value", "headers")


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


class Counts(AccumulatorParam):
    """The counts of one write's tasks: a list of dicts, one per COUNTED_BY group per task,
    each with "count" and the sums of "received" and "pending_delta". Spark applies an action's
    task updates once, from its successful attempt, so every row is counted once."""

    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1


def count_rows(batch: pa.RecordBatch) -> list[dict]:
    """A batch's rows counted by COUNTED_BY, with the sums of received and pending_delta."""
    keys = list(COUNTED_BY)
    table = pa.Table.from_batches([batch.select(keys + ["received", "pending_delta"])])
    groups = table.group_by(keys, use_threads=False).aggregate(
        [([], "count_all"), ("received", "sum"), ("pending_delta", "sum")])
    return [{**{k: row[k] for k in keys}, "count": row["count_all"],
             "received": row["received_sum"], "pending_delta": row["pending_delta_sum"]}
            for row in groups.to_pylist()]
