"""The dead-letter table: every record the wheel rejected, beside the dead-letter topic. (The
delivery ledger is written by the ledger query, streaming/ledger_query.py.)"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.base import BatchSummary, Sent
from sinks.delta import DeltaBatchTable


def dead_letter_columns(batch_id: int) -> list:
    """The dead-letter table's columns from dead rows, shared by the wheel's rejections and the
    dispatch's (streaming/ledger_query.py) so both write one schema."""
    return ["uniq_key", "key", "value", "headers", "reason",
            F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
            "append_ms", F.col("sent_ms").alias("dead_ms"),
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("dead_date")]


class DeadLetterTable(DeltaBatchTable):
    """Every rejected record, beside the dead-letter topic: the record as it came (key,
    value, headers), why, and where it was on the intake."""

    name = "dead_letters"
    partition_by = ("dead_date",)

    def rows(self, sent: Sent, summary: BatchSummary) -> DataFrame | None:
        return self.select(sent.frame(), summary) if summary.count("dead") else None

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        return sent.filter(F.col("kind") == "dead").select(*dead_letter_columns(summary.batch_id))
