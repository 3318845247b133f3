"""The ledger query: the dispatch tasks' ledger topic → the Delta ledger and dead-letter tables,
on a trigger of `ledger_interval`, and the delivery metrics (delivered per level, the lateness
histogram, dead letters per reason) from its batches. Each append is idempotent on (query id,
batch id) across restarts. A message is in the ledger topic once: a starting dispatch task
skips what its ledger partition already holds (sinks/dispatch.py), so no state is kept here to
drop second copies; a batch drops any it holds itself.
"""
from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from conf.settings import Settings
from sinks.base import BatchSummary
from sinks.delta import append_once, query_id
from sinks.metrics import LATENESS_BUCKETS, Metrics
from streaming.kafka_config import spark_options

log = logging.getLogger(__name__)

ROW = ("uniq_key string, topic string, partition int, level int, ipart int, ioff long, "
       "append_ms long, due_ms long, sent_ms long, ready_offset long, status string, "
       "reason string, key string, value string, headers array<array<string>>")


def ledger_checkpoint(checkpoint: str) -> str:
    """The ledger query's checkpoint, beside the wheel's."""
    return checkpoint.rstrip("/") + "-ledger"


def ledger_stream(spark: SparkSession, settings: Settings) -> DataFrame:
    raw = (spark.readStream.format("kafka").options(**spark_options(settings))
           .option("subscribe", settings.ledger_topic).option("startingOffsets", "earliest")
           .option("failOnDataLoss", "true").load())
    # A record holds the rows one dispatch task had acknowledged together (a JSON array); a
    # probe (an object) parses to null and goes.
    rows = (raw.select(F.explode(F.from_json(F.col("value").cast("string"), f"array<struct<{ROW}>>"))
                       .alias("r"), F.col("timestamp").alias("ledger_time"))
            .select("r.*", "ledger_time")
            .filter(F.col("uniq_key").isNotNull()))
    return rows


class LedgerWriter:
    """foreachBatch of the ledger query."""

    def __init__(self, settings: Settings, checkpoint: str, metrics: Metrics | None,
                 on_batch=None):
        self.settings, self.checkpoint, self.metrics = settings, checkpoint, metrics
        self.on_batch = on_batch
        self._app_id: str | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self._app_id is None:
            self._app_id = query_id(self.checkpoint)
        batch = batch.dropDuplicates(["uniq_key", "due_ms"]).persist()
        try:
            self._write(batch, batch_id)
        finally:
            batch.unpersist()

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        now_ms = int(time.time() * 1000)
        summary = BatchSummary(batch_id, now_ms)
        delivered = batch.filter(F.col("status") == "delivered")
        lateness = F.col("sent_ms") - F.col("due_ms")
        counted = batch.groupBy("status", "level", "reason").agg(
            F.count("*").alias("n"), F.sum(lateness).alias("total_ms"),
            *[F.sum(F.when(lateness <= b * 1000, 1).otherwise(0)).alias(f"le{i}")
              for i, b in enumerate(LATENESS_BUCKETS)]).collect()
        stats = [row for row in counted if row["status"] == "delivered"]
        dead = [row for row in counted if row["status"] == "dead"]
        if stats:
            append_once(delivered.select(
                "uniq_key", "topic", "partition", "level",
                F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
                "append_ms", "due_ms", "sent_ms", lateness.alias("lateness_ms"),
                F.lit(batch_id).cast("long").alias("batch_id"),
                F.lit(now_ms).cast("long").alias("batch_time"),
                F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("sent_date")),
                str(self.settings.ledger_path), self._app_id, batch_id, ("sent_date",))
        if dead:
            self._dead_letters(batch, batch_id)
        for row in stats:
            summary.add("deliver", row["level"], None, row["n"])
        for row in dead:
            summary.add("dead", None, row["reason"], row["n"])
        if stats:
            counts = [sum(row[f"le{i}"] for row in stats) for i in range(len(LATENESS_BUCKETS))]
            summary.lateness = (counts, sum(row["n"] for row in stats),
                                sum(row["total_ms"] for row in stats) / 1000)
        if self.metrics is not None:
            self.metrics.observe_sent(summary.delivered_by_level, summary.lateness)
            for reason, n in summary.dead_by_reason.items():
                self.metrics.dead.labels(reason=reason).inc(n)
        if self.on_batch is not None:
            self.on_batch(summary)

    def _dead_letters(self, batch: DataFrame, batch_id: int) -> None:
        """Rows the dispatch could not deliver (the real topic refused them) to the dead-letter
        table, as they came, beside those the wheel rejected."""
        headers = F.transform("headers", lambda h: F.struct(
            h[0].alias("key"), F.unbase64(h[1]).alias("value")))
        rows = batch.filter(F.col("status") == "dead").select(
            "uniq_key", F.unbase64("key").alias("key"), F.unbase64("value").alias("value"),
            headers.alias("headers"), "reason", F.col("ipart").alias("intake_partition"),
            F.col("ioff").alias("intake_offset"), "append_ms", F.col("sent_ms").alias("dead_ms"),
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("dead_date"))
        append_once(rows, str(self.settings.dead_letter_path), self._app_id, batch_id,
                    ("dead_date",))


def start_ledger_query(spark: SparkSession, settings: Settings, checkpoint: str,
                       metrics: Metrics | None = None, on_batch=None, name: str | None = None):
    location = ledger_checkpoint(checkpoint)
    writer = LedgerWriter(settings, location, metrics, on_batch)
    return (ledger_stream(spark, settings).writeStream
            .queryName(name or f"delayq-ledger-{settings.intake_topic}")
            .foreachBatch(writer)
            .option("checkpointLocation", location)
            .trigger(processingTime=f"{settings.ledger_interval_ms} milliseconds")
            .start())
