"""The Kafka sink: delivered messages to their real topics, rejected ones to the dead-letter
topic. At-least-once: a replayed batch sends its messages again, with the same UNIQ_KEY.

Before writing it checks every real topic against the cluster's metadata: a message for a
topic that does not exist, or for a partition beyond the topic's last, becomes a dead letter
with its reason, instead of blocking the Kafka writer and failing every later batch.
"""
from __future__ import annotations

import time

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from sinks.base import BatchSink, BatchSummary  # noqa: F401
from state import headers as H
from state.hold import hold_until_due

# Send as soon as a held row is released: lateness, not throughput, is what this writer buys.
PRODUCER_OPTIONS = {"kafka.linger.ms": "1", "kafka.acks": "all", "kafka.max.block.ms": "30000"}


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


class KafkaSink(BatchSink):
    name = "kafka"

    def __init__(self, options: dict[str, str], dlq_topic: str, catalog, parallelism: int):
        self._options = {**PRODUCER_OPTIONS, **options}
        self._dlq = dlq_topic
        self._catalog = catalog
        self._parallelism = max(1, parallelism)

    def topic_sizes(self, topics) -> dict[str, int | None]:
        """Partition count of each real topic (None: the topic does not exist)."""
        return self._catalog.partitions(sorted(topics))

    @staticmethod
    def refusal(topic: str, partition: int | None, sizes: dict[str, int | None]) -> str | None:
        """The dead-letter reason for a delivery the cluster cannot take, else None."""
        size = sizes.get(topic)
        if size is None:
            return f"REAL_TOPIC '{topic}' does not exist"
        if partition is not None and partition >= size:
            return f"REAL_QID {partition} is out of range: topic '{topic}' has {size} partitions"
        return None

    def refuse_unknown_topics(self, batch: DataFrame,
                              refusals: dict[tuple[str, int | None], str]) -> DataFrame:
        """Turn the batch's deliveries to the refused (topic, partition) pairs into dead
        letters. The pairs and reasons come from `refusal`, decided once on the driver from
        the batch's aggregate, so the rule lives in one place."""
        if not refusals:
            return batch
        pairs = [x for (topic, part), why in refusals.items()
                 for x in (F.lit(f"{topic}|{'' if part is None else part}"), F.lit(why))]
        place = F.concat_ws("|", "topic", F.coalesce(F.col("partition").cast("string"), F.lit("")))
        reason = F.when(F.col("kind") == "deliver", F.try_element_at(F.create_map(*pairs), place))
        extra = F.filter(F.array(
            header_struct(H.REAL_TOPIC, F.col("topic")),
            header_struct(H.REAL_QID, F.col("partition").cast("string")),
            header_struct(H.DLQ_REASON, F.col("_refused")),
        ), lambda h: h["value"].isNotNull())
        refused = F.col("_refused").isNotNull()
        return (batch.withColumn("_refused", reason)
                .withColumn("headers", F.when(refused, F.concat("headers", extra))
                            .otherwise(F.col("headers")))
                .withColumn("kind", F.when(refused, F.lit("dead")).otherwise(F.col("kind")))
                .withColumn("reason", F.coalesce("_refused", "reason"))
                .withColumn("topic", F.when(refused, F.lit(self._dlq)).otherwise(F.col("topic")))
                .withColumn("partition", F.when(refused, F.lit(None).cast("int"))
                            .otherwise(F.col("partition")))
                .withColumn("due_ms", F.when(refused, F.lit(0).cast("long"))
                            .otherwise(F.col("due_ms")))
                .drop("_refused"))

    def warm_up(self, spark, intake_topic: str) -> None:
        """Write one heartbeat to the intake through this sink's Kafka writer, so the first
        batch with deliveries does not also pay for creating the executors' producer."""
        from state import headers as H

        (spark.createDataFrame([(intake_topic, 0, None, b"", [(H.HEARTBEAT, b"1")])],
                               "topic string, partition int, key binary, value binary, "
                               "headers array<struct<key:string,value:binary>>")
         .write.format("kafka").options(**self._options).save())

    @staticmethod
    def sent_schema(batch_schema: StructType) -> StructType:
        return StructType(batch_schema.fields + [StructField("sent_ms", LongType())])

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> DataFrame:
        """Send the batch's deliveries and dead letters, each at its due time. Returns what
        was sent (with `sent_ms`, the moment each row was released), persisted for the
        tables that record it; the caller unpersists it."""
        out = batch.filter(F.col("kind").isin("deliver", "dead"))
        schema = self.sent_schema(out.schema)
        sent = (out.coalesce(self._parallelism)
                .mapInPandas(hold_and_stamp, schema)
                .persist(StorageLevel.MEMORY_AND_DISK))
        (sent.select("topic", "partition", "key", "value", "headers")
         .write.format("kafka").options(**self._options).save())
        return sent


def hold_and_stamp(frames):
    for chunk in hold_until_due(frames):
        yield chunk.assign(sent_ms=int(time.time() * 1000))
