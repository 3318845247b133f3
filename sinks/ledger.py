"""The delivery ledger: one Delta row per delivered message, exactly once per batch.

Kafka may hold a message twice after a crash (same UNIQ_KEY); the ledger holds it once:
the one true record of what was delivered, when, and how late.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.base import BatchSummary
from sinks.delta import DeltaBatchTable

LEDGER_COLUMNS = (
    "uniq_key", "topic", "partition", "level", "intake_partition", "intake_offset",
    "append_ms", "due_ms", "sent_ms", "lateness_ms", "batch_id", "batch_time", "sent_date",
)


class DeliveryLedger(DeltaBatchTable):
    name = "ledger"
    partition_by = ("sent_date",)

    def rows(self, sent: DataFrame, summary: BatchSummary) -> DataFrame | None:
        return self.select(sent, summary) if summary.count("deliver") else None

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        return (sent.filter(F.col("kind") == "deliver").select(
            "uniq_key", "topic", "partition", "level",
            F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
            "append_ms", "due_ms", "sent_ms",
            (F.col("sent_ms") - F.col("due_ms")).alias("lateness_ms"),
            F.lit(summary.batch_id).cast("long").alias("batch_id"),
            F.lit(summary.batch_time_ms).cast("long").alias("batch_time"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("sent_date"),
        ))


class DeadLetterTable(DeltaBatchTable):
    """Every rejected record, beside the dead-letter topic: the record as it came (key,
    value, headers), why, and where it was on the intake."""

    name = "dead_letters"
    partition_by = ("dead_date",)

    def rows(self, sent: DataFrame, summary: BatchSummary) -> DataFrame | None:
        return self.select(sent, summary) if summary.count("dead") else None

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        return (sent.filter(F.col("kind") == "dead").select(
            "uniq_key", "key", "value", "headers", "reason",
            F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
            "append_ms", F.col("sent_ms").alias("dead_ms"),
            F.lit(summary.batch_id).cast("long").alias("batch_id"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("dead_date"),
        ))
