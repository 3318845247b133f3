"""What the wheel's Kafka writes share: the producer options of Spark's Kafka sink, header
columns, the sent rows' schema and a list accumulator."""
from __future__ import annotations

from pyspark import AccumulatorParam
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType


def producer_options(settings) -> dict[str, str]:
    """The options of Spark's Kafka sink for the wheel's writes: every record acknowledged by
    all in-sync replicas before the batch ends, and the batching of `conf/defaults.toml`."""
    return {"kafka.acks": "all", "kafka.max.block.ms": "30000",
            "kafka.linger.ms": str(settings.ready_linger_ms),
            "kafka.batch.size": str(settings.ready_batch_kb * 1024)}


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


def appended_headers(*extra: F.Column) -> F.Column:
    """The row's `headers` (null: none) followed by the `extra` header structs whose value is
    not null."""
    return F.concat(
        F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,value:binary>>")),
        F.filter(F.array(*extra), lambda h: h["value"].isNotNull()))


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
