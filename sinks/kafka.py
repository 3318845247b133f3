"""What the wheel's Kafka writes share: the producer options of Spark's Kafka sink, header
columns, the read-back of intake records and the sent rows' schema."""
from __future__ import annotations

import json

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType


def producer_options(settings) -> dict[str, str]:
    """The options of Spark's Kafka sink for the wheel's writes: every record acknowledged by
    all in-sync replicas before the batch ends, and the batching of `conf/defaults.toml`."""
    return {"kafka.acks": "all", "kafka.max.block.ms": "30000",
            "kafka.linger.ms": str(settings.ready_linger_ms),
            "kafka.batch.size": str(settings.ready_batch_kb * 1024)}


HEADERS_TYPE = "array<struct<key:string,value:binary>>"


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


def appended_headers(*extra: F.Column) -> F.Column:
    """The row's `headers` (null: none), then the `extra` header structs whose value is not null."""
    return F.concat(
        F.coalesce(F.col("headers"), F.array().cast(HEADERS_TYPE)),
        F.filter(F.array(*extra), lambda h: h["value"].isNotNull()))


def intake_bodies(refs: DataFrame, topic: str, options: dict[str, str]) -> DataFrame:
    """`refs` (naming intake records by ipart and ioff; at least one) with each record's key,
    value and headers, read back in the JVM in one bounded Kafka read of their offset span per
    partition, and `found`: true, or null for a record that is gone (its body null too)."""
    spans = refs.groupBy("ipart").agg(F.min("ioff").alias("low"), F.max("ioff").alias("high"))
    spans = spans.collect()
    columns = [*refs.columns, "key", "value", "headers", "found"]
    records = (refs.sparkSession.read.format("kafka").options(**options)
               .option("assign", json.dumps({topic: [r["ipart"] for r in spans]}))
               .option("startingOffsets", json.dumps(
                   {topic: {str(r["ipart"]): r["low"] for r in spans}}))
               .option("endingOffsets", json.dumps(
                   {topic: {str(r["ipart"]): r["high"] + 1 for r in spans}}))
               .option("includeHeaders", "true")
               .option("kafka.isolation.level", "read_committed")
               # A record deleted since the wheel read it is a null body here, not a failure.
               .option("failOnDataLoss", "false")
               .load()
               .select(F.col("partition").alias("ipart"), F.col("offset").alias("ioff"),
                       "key", "value", "headers", F.lit(True).alias("found")))
    return refs.join(records, ["ipart", "ioff"], "left").select(*columns)


def sent_schema(batch_schema: StructType) -> StructType:
    """A batch's schema with the time its rows were written (`sent_ms`)."""
    return StructType(batch_schema.fields + [StructField("sent_ms", LongType())])

