"""Delta tables written exactly once per micro-batch across crashes: each write carries
`txnAppId` (the query's id, stable across restarts) and `txnVersion` (the batch id), so Delta
skips a batch Spark replays."""
from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.types import StructField, StructType

from sinks import store


def table_exists(path: str | Path) -> bool:
    """A Delta table with at least one commit (its log folder appears before the first)."""
    log = store.path(path) / "_delta_log"
    return log.is_dir() and any(p.name.endswith(".json") for p in log.iterdir())


def query_id(checkpoint: str | Path) -> str:
    """The streaming query's id, kept in the checkpoint's metadata file."""
    return json.loads((store.path(checkpoint) / "metadata").read_text())["id"]


def create_table(spark, path: str, schema, partition_by: tuple[str, ...]) -> None:
    """An empty Delta table unless one is there: locally by delta-rs (no Spark job at start), on
    a store (HDFS, S3) by Delta's builder. Every column nullable, as Spark's writes declare them."""
    schema = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema])
    if store.is_local(path):
        from deltalake import DeltaTable
        from pyspark.sql.pandas.types import to_arrow_schema

        DeltaTable.create(str(path).removeprefix("file:"), schema=to_arrow_schema(schema),
                          mode="ignore", partition_by=list(partition_by))
        return
    from delta.tables import DeltaTable as SparkDeltaTable

    (SparkDeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema)
     .partitionedBy(*partition_by).execute())


def append_once(rows: DataFrame, path: str, app_id: str, txn_version: int,
                partition_by: tuple[str, ...], merge_schema: bool = False) -> None:
    """Append rows in one Delta commit, skipped when the table already has `txn_version` (or
    a later one) of `app_id`. `merge_schema`: a column the table lacks is added to it."""
    writer = (rows.write.format("delta").mode("append").partitionBy(*partition_by)
              .option("txnAppId", app_id).option("txnVersion", txn_version))
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    writer.save(path)
