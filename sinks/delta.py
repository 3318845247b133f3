"""Delta tables written once per micro-batch, exactly once across crashes.

Each write carries Delta's idempotent-write options: `txnAppId` (the streaming query's id,
stable across restarts of one checkpoint) and `txnVersion` (the batch id). When Spark replays
a batch after a crash, Delta sees the pair already committed and skips the write.
"""
from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame

from sinks import store
from sinks.base import BatchSink, BatchSummary, Sent



def table_exists(path: str | Path) -> bool:
    """A Delta table with at least one commit (its log folder appears before the first)."""
    log = store.path(path) / "_delta_log"
    return log.is_dir() and any(p.name.endswith(".json") for p in log.iterdir())


def query_id(checkpoint: str | Path) -> str:
    """The streaming query's id, kept in the checkpoint's metadata file."""
    return json.loads((store.path(checkpoint) / "metadata").read_text())["id"]


def create_table(spark, path: str, schema, partition_by: tuple[str, ...] = ()) -> None:
    """An empty Delta table, unless one is there. In a local folder delta-rs writes its
    first commit in milliseconds, with no Spark job (a Spark write of no rows took 8-10 s of a
    young JVM's start for the two tables); on a store (HDFS, S3), Delta's own builder. Every
    column nullable, as Spark's writes declare them."""
    from pyspark.sql.types import StructField, StructType

    schema = StructType([StructField(f.name, f.dataType, True, f.metadata) for f in schema])
    if store.is_local(path):
        from deltalake import DeltaTable
        from pyspark.sql.pandas.types import to_arrow_schema

        DeltaTable.create(str(path).removeprefix("file:"), schema=to_arrow_schema(schema),
                          mode="ignore", partition_by=list(partition_by) or None)
        return
    from delta.tables import DeltaTable as SparkDeltaTable

    builder = SparkDeltaTable.createIfNotExists(spark).location(str(path)).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    builder.execute()


def append_once(rows: DataFrame, path: str, app_id: str, txn_version: int,
                partition_by: tuple[str, ...] = (), merge_schema: bool = False) -> None:
    """Append rows in one Delta commit, skipped when the table already has `txn_version` (or
    a later one) of `app_id`. `merge_schema`: a column the table lacks is added to it."""
    writer = (rows.write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", txn_version))
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(path)


class DeltaBatchTable(BatchSink):
    """A Delta table fed from the sent rows of each batch; subclasses choose rows and columns."""

    partition_by: tuple[str, ...] = ()

    def __init__(self, path: str | Path, checkpoint: str | Path):
        self.path = str(path)
        self._checkpoint = checkpoint
        self._app_id: str | None = None

    def rows(self, sent: Sent, summary: BatchSummary) -> DataFrame | None:
        raise NotImplementedError

    def ensure_table(self, spark, sent_schema) -> None:
        """Create the (empty) table before the first batch, so that batch pays no Delta
        table creation on top of its deliveries."""
        if not table_exists(self.path):
            schema = self.select(spark.createDataFrame([], sent_schema), BatchSummary(-1)).schema
            create_table(spark, self.path, schema, self.partition_by)

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        raise NotImplementedError

    def write_batch(self, sent: Sent, summary: BatchSummary) -> None:
        rows = self.rows(sent, summary)
        if rows is not None:
            self.save(rows, summary.batch_id)

    def save(self, rows: DataFrame, txn_version: int) -> None:
        """Append rows in one Delta commit, skipped when the table already has this
        txnVersion (or a later one) of the query."""
        append_once(rows, self.path, self.app_id(), txn_version, self.partition_by)

    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = query_id(self._checkpoint)
        return self._app_id
