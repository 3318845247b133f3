"""Upkeep of the ledger and dead-letter tables: OPTIMIZE, retention (DELETE) and VACUUM; safe
while the job runs (Delta's optimistic concurrency)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.sql import SparkSession

from sinks.delta import table_exists


def maintain(spark: SparkSession, table: str, date_column: str, retain_days: int | None,
             vacuum_hours: int) -> dict:
    if not table_exists(table):
        return {"table": str(table), "skipped": "no table yet"}
    result = {"table": str(table)}
    if retain_days is not None:
        cutoff = (datetime.now(timezone.utc) - timedelta(days=retain_days)).strftime("%Y-%m-%d")
        spark.sql(f"DELETE FROM delta.`{table}` WHERE {date_column} < '{cutoff}'")
        result["deleted_before"] = cutoff
    metrics = spark.sql(f"OPTIMIZE delta.`{table}`").collect()
    result["optimize"] = metrics[0]["metrics"]["numFilesRemoved"] if metrics else 0
    spark.sql(f"VACUUM delta.`{table}` RETAIN {vacuum_hours} HOURS")
    result["vacuum_retain_hours"] = vacuum_hours
    return result
