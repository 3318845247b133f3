"""The wheel's Kafka sink with `hold = "executors"`: every fired message goes to the ready topic
(`<intake>.READY`) with its restore information in trailing headers, for the dispatch tasks
(sinks/dispatch.py) to send at its due time; dead letters go straight to the dead-letter
topic. Nothing waits here: a batch ends when Kafka has its rows.

The ready partition of a row keeps what Kafka keeps in order on one path: the messages to one
(topic, REAL_QID), and one key's messages to one topic, go through one partition and so one
dispatch task, which sends them in due order. The rest spread by UNIQ_KEY.
"""
from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.base import BatchSummary, Sent
from sinks.dispatch import READY_FROM, READY_LEVEL, READY_QID, READY_TOPIC
from sinks.kafka import KAFKA_COLUMNS, PRODUCER_OPTIONS, HoldReports, header_struct
from state.columns import OUTPUT
from state.worker import settle

_SENT_KINDS = pa.array(["deliver", "dead"], pa.string())
_OUT = ("_topic", "_partition", "key", "value", "_headers")


def ready_lane(partitions: int) -> F.Column:
    """The ready partition of a delivery (see the module's docstring)."""
    n = F.lit(partitions)
    return (F.when(F.col("partition").isNotNull(), F.pmod(F.hash("topic", "partition"), n))
            .when(F.col("key").isNotNull(), F.pmod(F.hash("topic", "key"), n))
            .otherwise(F.pmod(F.hash("uniq_key"), n))).cast("int")


def ready_headers() -> F.Column:
    """The message's headers as delivered, then the restore headers the dispatch removes."""
    restore = F.filter(F.array(
        header_struct(READY_TOPIC, F.col("topic")),
        header_struct(READY_QID, F.col("partition").cast("string")),
        header_struct(READY_LEVEL, F.col("level").cast("string")),
        header_struct(READY_FROM, F.concat_ws("-", "ipart", "ioff", "append_ms")),
    ), lambda h: h["value"].isNotNull())
    return F.concat(F.coalesce("headers", F.array().cast(
        "array<struct<key:string,value:binary>>")), restore)


def counting(reports):
    """The Arrow function of the write: counts every row of the batch by the Kafka sink's
    COUNTED_BY into the accumulator `reports`, and yields the rows to send, as Kafka takes them."""
    from sinks.kafka import count_rows

    def count(batches):
        settle()
        counts = []
        for batch in batches:
            if not batch.num_rows:
                continue
            counts.extend(count_rows(batch))
            out = batch.filter(pc.is_in(batch.column("kind"), value_set=_SENT_KINDS))
            if out.num_rows:
                yield out.select(list(_OUT)).rename_columns(list(KAFKA_COLUMNS))
        if counts:
            reports.add({**HoldReports.zero(None), "counts": counts})
    return count


class ReadySink:
    name = "kafka"
    hold = None

    def __init__(self, spark, options: dict[str, str], ready_topic: str, partitions: int,
                 max_request_bytes: int = 1_048_576):
        self._options = {**PRODUCER_OPTIONS, "kafka.max.request.size": str(max_request_bytes),
                         **options}
        self._reports = spark.sparkContext.accumulator(HoldReports.zero(None), HoldReports())
        deliver = F.col("kind") == "deliver"
        self._columns = [
            *[F.col(name) for name in OUTPUT.names],
            F.when(deliver, F.lit(ready_topic)).otherwise(F.col("topic")).alias("_topic"),
            F.when(deliver, ready_lane(partitions)).otherwise(F.col("partition")).alias("_partition"),
            F.when(deliver, ready_headers()).otherwise(F.col("headers")).alias("_headers"),
        ]
        self._schema = "topic string, partition int, key binary, value binary, " \
                       "headers array<struct<key:string,value:binary>>"

    def warm_up(self, spark, intake_topic: str) -> None:
        from state import headers as H

        (spark.createDataFrame([(intake_topic, 0, None, b"", [(H.HEARTBEAT, b"1")])],
                               self._schema).write.format("kafka").options(**self._options).save())

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> Sent:
        """Fired rows to the ready topic and dead letters to theirs, in the batch's one Spark
        job, every row counted into `summary` on the way. Deliveries are counted as fired, not
        delivered: the ledger query counts them once the dispatch has sent them."""
        self._reports.value = HoldReports.zero(None)
        (batch.select(*self._columns).mapInArrow(counting(self._reports), self._schema)
         .write.format("kafka").options(**self._options).save())
        for row in HoldReports.counts(self._reports.value):
            summary.add(row["kind"], row["level"], row["reason"], row["count"],
                        row["received"] or 0, row["pending_delta"] or 0, delivered=False)
        summary.deferred = True
        now_ms = int(time.time() * 1000)
        return Sent(lambda: batch.filter(F.col("kind").isin("deliver", "dead"))
                    .withColumn("sent_ms", F.lit(now_ms).cast("long")), batch.sparkSession)
