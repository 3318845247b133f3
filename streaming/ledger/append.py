"""The ledger query's task, one per batch in an executor: the batch's ledger records decoded, the
delivered and cancelled rows appended to the Delta ledger by delta-rs in one commit that carries
(query id, batch id), as Delta's `txnAppId`/`txnVersion` do, and every row counted for the
delivery metrics. A batch of 150,000 rows cost the idle 2-core host 0.6-0.9 CPU-s so, against
3.6-4.0 through Spark's Delta writer, 2 of them per commit whatever its size (Delta 4.4 rebuilds
the table's whole state to find the batch id)."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sinks import store
from sinks.metrics import LATENESS_BUCKETS
from streaming.dispatch.cancels import CANCELLED

_KEYS = ("status", "level", "reason", "direct")
_SUMS = ("lateness_sum", *(f"le{i}_sum" for i in range(len(LATENESS_BUCKETS))))
COUNTS_SCHEMA = pa.schema([("status", pa.string()), ("level", pa.int32()),
                           ("reason", pa.string()), ("direct", pa.bool_()),
                           ("count_all", pa.int64()), *((name, pa.int64()) for name in _SUMS)])
LEDGER_TABLE_SCHEMA = pa.schema([
    ("uniq_key", pa.string()), ("status", pa.string()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()), ("level", pa.int32()),
    ("intake_partition", pa.int32()), ("intake_offset", pa.int64()), ("append_ms", pa.int64()),
    ("due_ms", pa.int64()), ("sent_ms", pa.int64()), ("lateness_ms", pa.int64()),
    ("batch_id", pa.int64()), ("batch_time", pa.int64()), ("sent_date", pa.string())])


def delta_rs_uri(location: str) -> str:
    """A table's location as delta-rs opens it: a local path, or the store's URL (s3a://,
    hdfs://)."""
    return str(store.path(location)) if store.is_local(location) else str(location)


def delta_table(location, options: dict[str, str]):
    """The table at `location` as delta-rs opens it; None without one (or a commit)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(delta_rs_uri(str(location)), storage_options=options or None)
    except TableNotFoundError:
        return None


@dataclass(frozen=True)
class LedgerAppend:
    """Where and as what a batch's rows are appended; `uri` None: counted only (no tables)."""

    uri: str | None
    options: dict
    app_id: str
    batch_id: int
    batch_time: int

    def holds_batch(self, table) -> bool:
        """Whether `table` (None: none yet) holds this batch (an earlier run of it committed)."""
        done = table.transaction_version(self.app_id) if table is not None else None
        return done is not None and done >= self.batch_id

    def rows(self, table: pa.Table) -> pa.Table:
        """The ledger table's rows of the delivered and cancelled messages among `table`'s."""
        table = table.filter(pc.is_in(table["status"], pa.array(["delivered", CANCELLED])))
        n, sent = table.num_rows, table["sent_ms"]
        return pa.table([
            table["uniq_key"], table["status"], table["topic"], table["partition"],
            table["offset"], table["level"], table["ipart"], table["ioff"], table["append_ms"],
            table["due_ms"], sent, pc.subtract(sent, table["due_ms"]),
            pa.repeat(pa.scalar(self.batch_id, pa.int64()), n),
            pa.repeat(pa.scalar(self.batch_time, pa.int64()), n),
            pc.strftime(sent.cast(pa.timestamp("ms", "UTC")), "%Y-%m-%d")],
            schema=LEDGER_TABLE_SCHEMA)


def decoded(batch: pa.RecordBatch) -> pa.Table | None:
    """The ledger rows of a batch of ledger records (its `value` column); None for none."""
    from streaming.ledger.records import ledger_rows

    records = batch.column("value").to_pylist()
    return pa.concat_tables([ledger_rows(record) for record in records]) if records else None


def counted(table: pa.Table) -> dict[tuple, list[int]]:
    """`table`'s ledger rows by status, level, reason and whether the dispatch read them from
    the intake itself (neither fired by the wheel, ringed nor rolled from the cold tier, so never
    seen by the wheel, and counted as received here): rows, lateness sum and per histogram
    bucket."""
    lateness = pc.subtract(table["sent_ms"], table["due_ms"])
    direct = pc.and_(pc.and_(table["ready_offset"].is_null(), table["ring_offset"].is_null()),
                     pc.invert(pc.fill_null(table["rolled"], False)))
    columns = {"status": table["status"], "level": table["level"], "reason": table["reason"],
               "direct": direct, "lateness": lateness}
    for i, bound in enumerate(LATENESS_BUCKETS):
        columns[f"le{i}"] = pc.less_equal(lateness, int(bound * 1000)).cast(pa.int64())
    sums = ["lateness", *(f"le{i}" for i in range(len(LATENESS_BUCKETS)))]
    groups = pa.table(columns).group_by(list(_KEYS), use_threads=False).aggregate(
        [([], "count_all"), *((name, "sum") for name in sums)])
    return {tuple(row[k] for k in _KEYS): [row["count_all"], *(row[f"{s}_sum"] or 0 for s in sums)]
            for row in groups.to_pylist()}


def merge(total: dict[tuple, list[int]], part: dict[tuple, list[int]]) -> None:
    for key, values in part.items():
        known = total.setdefault(key, [0] * len(values))
        total[key] = [a + b for a, b in zip(known, values)]


def counts_batch(total: dict[tuple, list[int]]) -> pa.RecordBatch:
    rows = [dict(zip(_KEYS, key)) | dict(zip(("count_all", *_SUMS), values))
            for key, values in total.items()]
    return pa.RecordBatch.from_pylist(rows, schema=COUNTS_SCHEMA)


def ledger_task(target: LedgerAppend, batches):
    """mapInArrow over one partition holding the whole batch: its counts, one row per group,
    after the append (skipped when the table holds the batch: a retried task counts again,
    but only the job's one result is read)."""
    total: dict[tuple, list[int]] = {}

    def ledger_batches():
        for table in filter(None, map(decoded, batches)):
            merge(total, counted(table))
            yield from target.rows(table).to_batches()

    # Opened once: its log read for the batch's check serves the append.
    table = delta_table(target.uri, target.options) if target.uri is not None else None
    if target.uri is None or target.holds_batch(table):
        for _ in ledger_batches():
            pass
    else:
        from deltalake import CommitProperties, Transaction, write_deltalake

        write_deltalake(
            table if table is not None else target.uri,
            pa.RecordBatchReader.from_batches(LEDGER_TABLE_SCHEMA, ledger_batches()),
            mode="append", partition_by=["sent_date"], schema_mode="merge",
            storage_options=None if table is not None else target.options or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(target.app_id, target.batch_id)]))
    yield counts_batch(total)
