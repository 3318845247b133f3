"""Upkeep of the ledger and dead-letter tables: OPTIMIZE, retention (DELETE) and VACUUM; safe
while the job runs (Delta's optimistic concurrency) on a folder and on HDFS, whose renames are
atomic. On S3 Delta's default log store is safe for one writer at a time: there it runs only
while the job does not write (`s3_writer_busy`)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pyspark.sql import SparkSession

from sinks import store
from sinks.delta import table_exists

# A job writes a checkpoint commit at least every wheel trigger (its heartbeat keeps batches
# coming); none for this long: it is taken as stopped.
QUIET_MS = 120_000


def s3_writer_busy(checkpoints: list[str], now_ms: int) -> str | None:
    """Why maintenance must wait on S3: a checkpoint of the job committed within QUIET_MS."""
    for checkpoint in checkpoints:
        newest = (store.path(checkpoint) / "commits").newest_ms()
        if newest is not None and now_ms - newest < QUIET_MS:
            return (f"the job committed to {checkpoint} {(now_ms - newest) / 1000:.0f} s ago. "
                    f"On S3, Delta's log store is safe for one writer at a time: stop the job, "
                    f"wait until {QUIET_MS // 1000} s have passed since, and run it again")
    return None


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
