"""What the wheel's Kafka writes share: the producer options of Spark's Kafka sink, a header
column, a heartbeat write and a list accumulator."""
from __future__ import annotations

from pyspark import AccumulatorParam
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

# linger 1 ms, so a record on its own leaves at once, and batches of up to 256 KiB per
# partition (the Java client's default is 16 KiB, about fifteen 1 KiB records), so a burst, a
# drain or a catch-up goes out in far fewer, larger batches: a burst of 500,000 left in 37-39 s
# against 49-59 s with the default, the broker using 7-17 CPU-s less. An open batch holds its
# whole buffer from the producer's 32 MiB (`buffer.memory`).
PRODUCER_OPTIONS = {"kafka.linger.ms": "1", "kafka.acks": "all", "kafka.max.block.ms": "30000",
                    "kafka.batch.size": str(256 * 1024)}


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


def sent_schema(batch_schema: StructType) -> StructType:
    """A batch's schema with the time its rows were written (`sent_ms`)."""
    return StructType(batch_schema.fields + [StructField("sent_ms", LongType())])


class Counts(AccumulatorParam):
    """A list accumulator: the values tasks add (lists) concatenated (streaming/ledger_query.py
    counts its rows with it)."""

    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1
