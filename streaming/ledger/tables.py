"""The Delta tables `delayq ledger` reads: a local folder or S3 by delta-rs in this process (no
Spark to start); HDFS by a Spark session opened at its first need."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pyarrow as pa

from sinks import store
from streaming.ledger.append import delta_table

_SUMMARY = """SELECT level, count(*) AS delivered,
  CAST(round({percentile}(lateness_ms, 0.5)) AS BIGINT) AS p50_ms,
  CAST(round({percentile}(lateness_ms, 0.99)) AS BIGINT) AS p99_ms,
  max(lateness_ms) AS max_ms, sum(CASE WHEN lateness_ms < 0 THEN 1 ELSE 0 END) AS early
FROM ledger WHERE {where} GROUP BY level ORDER BY level"""


class Tables:
    """`options`: delta-rs's for an s3a:// store (sinks/store.py object_store_options)."""

    def __init__(self, session: Callable[[], object], options: dict[str, str] | None = None):
        self._session, self._spark, self._options = session, None, options or {}

    def by_delta_rs(self, location: str | Path) -> bool:
        return store.is_local(location) or str(location).startswith("s3a://")

    @property
    def spark(self):
        if self._spark is None:
            self._spark = self._session()
        return self._spark

    def close(self) -> None:
        if self._spark is not None:
            self._spark.stop()

    def matching(self, location: str | Path, uniq_key: str) -> list[dict]:
        """The rows of `uniq_key` in the table at `location` ([] without a table)."""
        if self.by_delta_rs(location):
            table = delta_table(location, self._options)
            if table is None:
                return []
            rows = table.scan(predicate=f'"uniq_key" = {_quoted(uniq_key)}')
            return pa.RecordBatchReader.from_stream(rows).read_all().to_pylist()
        from pyspark.sql import functions as F

        from sinks.delta import table_exists

        if not table_exists(location):
            return []
        rows = self.spark.read.format("delta").load(str(location))
        return [r.asDict() for r in rows.filter(F.col("uniq_key") == uniq_key).collect()]

    def summary(self, ledger: str | Path, since_ms: int | None, until_ms: int | None) -> list[dict]:
        """Per level over [since, until): delivered, p50, p99 and max lateness (ms), early."""
        where = [f"sent_ms {op} {int(ms)}" for op, ms in ((">=", since_ms), ("<", until_ms))
                 if ms is not None]

        def sql(names: list[str], percentile: str) -> str:
            # Delivered rows: a cancelled message's has its status (a table from before: none).
            kept = where + ["coalesce(status, 'delivered') = 'delivered'"] * ("status" in names)
            return _SUMMARY.format(where=" AND ".join(kept) or "true", percentile=percentile)
        if self.by_delta_rs(ledger):
            from deltalake import QueryBuilder

            table = delta_table(ledger, self._options)
            if table is None:
                return []
            names = [f.name for f in table.schema().fields]
            query = sql(names, "approx_percentile_cont")   # DataFusion's
            result = QueryBuilder().register("ledger", table).execute(query)
            return pa.RecordBatchReader.from_stream(result).read_all().to_pylist()
        from sinks.delta import table_exists

        if not table_exists(ledger):
            return []
        table = self.spark.read.format("delta").load(str(ledger))
        table.createOrReplaceTempView("ledger")
        return [r.asDict() for r in self.spark.sql(sql(table.columns,
                                                       "percentile_approx")).collect()]


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
