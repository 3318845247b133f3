"""The dead-letter table: every record the wheel rejected, beside the dead-letter topic."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.delta import append_once, create_table, query_id, table_exists


def dead_letter_columns(batch_id: int) -> list:
    """The dead-letter table's columns from dead rows, shared by the wheel's rejections and the
    dispatch's (streaming/ledger/query.py) so both write one schema."""
    return ["uniq_key", "key", "value", "headers", "reason",
            F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
            "append_ms", F.col("sent_ms").alias("dead_ms"),
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("dead_date")]


class DeadLetterTable:
    """Every rejected record as it came (key, value, headers), why, and where on the intake.
    Exactly once per batch: Delta skips a replayed batch (sinks/delta.py `append_once`)."""

    def __init__(self, path: str | Path, checkpoint: str | Path):
        self.path, self._checkpoint = str(path), checkpoint

    @cached_property
    def _query_id(self) -> str:
        """Read at the first append (the query writes its metadata at its start), then kept."""
        return query_id(self._checkpoint)

    def ensure_table(self, spark, sent_schema) -> None:
        """Create the empty table before the first batch, so that batch pays no table creation."""
        if not table_exists(self.path):
            schema = spark.createDataFrame([], sent_schema).select(*dead_letter_columns(-1)).schema
            create_table(spark, self.path, schema, ("dead_date",))

    def write_batch(self, dead: DataFrame, batch_id: int) -> None:
        """The batch's dead rows (WITH_BODY and `sent_ms`)."""
        append_once(dead.select(*dead_letter_columns(batch_id)), self.path,
                    self._query_id, batch_id, ("dead_date",))
