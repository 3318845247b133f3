"""The delivery ledger: one Delta row per delivered message, exactly once per batch.

Kafka may hold a message twice after a crash (same UNIQ_KEY); the ledger holds it once:
the one true record of what was delivered, when, and how late.

A Spark Delta commit was the largest fixed cost of a batch (0.6–1.4 s median in the
benchmarks), and nothing that is delivered needs to wait for it. So the ledger is written off the
delivery path: each batch's rows are spooled to a Parquet file beside the checkpoint, synced
before the batch commits, and a thread of the driver appends them to the Delta table while the
next batches run (`LedgerSpool`). A file that a crash leaves behind is appended after the
restart, before anything newer; Delta's txnAppId/txnVersion makes every append happen once.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sinks.base import BatchSummary, Sent
from sinks.delta import DeltaBatchTable, append_arrow_once
from sinks.store import is_local
from sinks.durable import write_durably

log = logging.getLogger(__name__)

# The spool's folder inside the query's checkpoint.
SPOOL_FOLDER = "ledger-spool"

LEDGER_COLUMNS = (
    "uniq_key", "topic", "partition", "level", "intake_partition", "intake_offset",
    "append_ms", "due_ms", "sent_ms", "lateness_ms", "batch_id", "batch_time", "sent_date",
)


def ledger_rows(sent: DataFrame, summary: BatchSummary) -> DataFrame:
    """The ledger's columns for the batch's deliveries."""
    return (sent.filter(F.col("kind") == "deliver").select(
        "uniq_key", "topic", "partition", "level",
        F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
        "append_ms", "due_ms", "sent_ms",
        (F.col("sent_ms") - F.col("due_ms")).alias("lateness_ms"),
        F.lit(summary.batch_id).cast("long").alias("batch_id"),
        F.lit(summary.batch_time_ms).cast("long").alias("batch_time"),
        F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("sent_date"),
    ))


# The ledger's columns as Arrow types (the same as `ledger_rows` gives in Spark).
LEDGER = pa.schema([
    ("uniq_key", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
    ("level", pa.int32()), ("intake_partition", pa.int32()), ("intake_offset", pa.int64()),
    ("append_ms", pa.int64()), ("due_ms", pa.int64()), ("sent_ms", pa.int64()),
    ("lateness_ms", pa.int64()), ("batch_id", pa.int64()), ("batch_time", pa.int64()),
    ("sent_date", pa.string()),
])
assert tuple(LEDGER.names) == LEDGER_COLUMNS


def delivered_rows(released: pa.Table, summary: BatchSummary) -> pa.Table:
    """The batch's deliveries in the ledger's columns, from the rows the hold tasks reported
    (sinks/kafka.py RELEASED), on the driver without a Spark job: what the ledger spools and
    what the lateness histogram is counted from. About 100 bytes a delivery."""
    n = released.num_rows
    sent = released.column("sent_ms").cast(pa.int64())
    columns = {
        "uniq_key": released.column("uniq_key"), "topic": released.column("topic"),
        "partition": released.column("partition"), "level": released.column("level"),
        "intake_partition": released.column("ipart"), "intake_offset": released.column("ioff"),
        "append_ms": released.column("append_ms"), "due_ms": released.column("due_ms"),
        "sent_ms": sent,
        "lateness_ms": pc.subtract(sent, released.column("due_ms").cast(pa.int64())),
        "batch_id": pa.array([summary.batch_id] * n, pa.int64()),
        "batch_time": pa.array([summary.batch_time_ms] * n, pa.int64()),
        "sent_date": _utc_dates(sent),
    }
    return pa.table([columns[f.name].cast(f.type) for f in LEDGER], schema=LEDGER)


def _utc_dates(epoch_ms: pa.ChunkedArray) -> pa.ChunkedArray:
    """The UTC date of each time, as Spark's date_format gives it in the session's time zone
    (UTC). Formatted once per distinct day: a batch spans one or two, and formatting every row
    took most of the time of building a batch's ledger rows."""
    days = pc.divide(epoch_ms, pa.scalar(86_400_000, pa.int64()))
    distinct = pc.unique(days)
    names = pc.strftime(pc.multiply(distinct, pa.scalar(86_400_000, pa.int64()))
                        .cast(pa.timestamp("ms")), "%Y-%m-%d")
    return pc.take(names, pc.index_in(days, value_set=distinct))


def collected_rows(sent: DataFrame, summary: BatchSummary) -> pa.Table:
    """The same rows by a Spark job over the sent frame: for a batch whose hold reports do
    not account for every delivery (see streaming/job.py)."""
    return ledger_rows(sent, summary).toArrow().cast(LEDGER)


class DeliveryLedger(DeltaBatchTable):
    name = "ledger"
    partition_by = ("sent_date",)

    def __init__(self, path: str | Path, checkpoint: str | Path):
        super().__init__(path, checkpoint)
        self.spool: LedgerSpool | None = None

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        return ledger_rows(sent, summary)

    def write_batch(self, sent: Sent, summary: BatchSummary) -> None:
        """The batch's ledger rows (`summary.delivered`, built by the job from the hold's
        reports; None when the batch delivered nothing) to the spool, or straight to the table
        when there is no spool."""
        if summary.delivered is None:
            return
        if self.spool is not None:
            self.spool.put(summary.batch_id, summary.delivered)
        else:
            # A ledger beside a checkpoint on a store: appended by this batch itself, with the
            # same rows the spool would have held.
            self.save(sent.session.createDataFrame(summary.delivered), summary.batch_id)

    def append(self, spark, files: list[Path], txn_version: int) -> None:
        """Append spooled files in one Delta commit. A table on the driver's file system is
        appended with delta-rs from the driver (the rows are about 100 bytes each, and no
        Spark job runs beside the batches); a table on a store through Spark (`save`), whose
        executors read the files from the volume they all mount."""
        if is_local(self.path):
            rows = pa.concat_tables([pq.read_table(p, columns=list(LEDGER_COLUMNS))
                                     for p in files], promote_options="default")
            append_arrow_once(rows, self.path, self.app_id(), txn_version, self.partition_by)
            return
        self.save(spark.read.parquet(*[str(p) for p in files]).select(*LEDGER_COLUMNS),
                  txn_version)


class LedgerSpool:
    """Delivered rows on the driver's disk until the Delta ledger has them.

    `put` writes one batch's rows to `<folder>/<batch id>.parquet` (a temporary name, fsync,
    rename), before the batch commits: once Spark has committed a batch, its ledger rows are
    on disk. The thread appends the files in batch order and deletes each once appended.

    Exactly once: a file is appended with txnVersion = its batch id, and Delta skips a version
    it has. Files up to `single_until` may already be in the table (a previous run appended
    them, or the batch is the one Spark replays), so each goes alone; later ones were spooled
    by this run only and are appended together, with the last batch id as the version.

    One append at most every `interval_s` (the oldest file waits that long, unless the spool
    is stopping): a Delta commit costs about as much CPU as a small batch's own work, and the
    batches share the cores with it."""

    def __init__(self, spark, ledger: DeliveryLedger, folder: Path, single_until: int = 0,
                 interval_s: float = 0.0, max_rows: int = 500_000,
                 on_behind: Callable[[int], None] | None = None):
        self.spark, self.ledger, self.folder = spark, ledger, Path(folder)
        self.interval_s = interval_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self.single_until = single_until
        self.max_rows = max_rows
        self.on_behind = on_behind
        self.appended = 0           # Delta commits made by this spool
        self.last_error: str | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @staticmethod
    def _id(path: Path) -> int:
        return int(path.stem)

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.parquet"), key=self._id)

    def put(self, batch_id: int, rows: pa.Table) -> None:
        write_durably(self.folder / f"{batch_id:019d}.parquet",
                      lambda f: pq.write_table(rows, f, compression="snappy"))
        with self._wake:
            self._wake.notify()

    def start(self) -> "LedgerSpool":
        for stale in self.folder.glob(".*.tmp"):   # a put cut short: its batch never committed
            stale.unlink()
        self._thread = threading.Thread(target=self._run, name="delayq-ledger", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> None:
        """Append what is spooled (within `timeout_s`), then end the thread. What is left
        stays on disk for the next start."""
        if self._thread is None:
            return
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            log.warning("ledger: %d spooled batches not yet appended; the next start appends them",
                        len(self.files()))
        self._thread = None

    def behind(self) -> int:
        return len(self.files())

    def _run(self) -> None:
        while True:
            files = self.files()
            if self.on_behind is not None:
                self.on_behind(len(files))
            if not files:
                with self._wake:
                    if self._stopping:
                        return
                    self._wake.wait(timeout=1.0)
                continue
            wait = self._due(files[0]) - time.time()
            if wait > 0:
                with self._wake:
                    if not self._stopping:
                        self._wake.wait(timeout=wait)
                if not self._stopping:
                    continue
            try:
                self._append(files)
                self.last_error = None
            except Exception as e:  # the rows stay spooled; try again
                self.last_error = str(e).splitlines()[0] if str(e) else type(e).__name__
                log.warning("ledger: append failed, retrying in 5 s: %s", self.last_error)
                with self._wake:
                    if self._stopping:
                        return
                    self._wake.wait(timeout=5.0)

    def _due(self, oldest: Path) -> float:
        """When the oldest file should be appended: `interval_s` after it was spooled, or now
        if it may already be in the table (a file of an earlier run goes at once)."""
        if self._id(oldest) <= self.single_until:
            return 0.0
        try:
            return oldest.stat().st_mtime + self.interval_s
        except FileNotFoundError:
            return 0.0

    def _append(self, files: list[Path]) -> None:
        take, rows = [], 0
        for path in files:
            if take and min(self._id(take[0]), self._id(path)) <= self.single_until:
                break
            n = pq.ParquetFile(path).metadata.num_rows
            if take and rows + n > self.max_rows:
                break
            take.append(path)
            rows += n
        self.ledger.append(self.spark, take, self._id(take[-1]))
        self.appended += 1
        for path in take:
            path.unlink()


def spooled(folder: Path, uniq_key: str) -> dict | None:
    """The ledger row of a delivered message still in the spool (not yet in the table)."""
    import pyarrow.compute as pc

    for path in sorted(Path(folder).glob("*.parquet")) if Path(folder).is_dir() else ():
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid):   # appended and deleted while we looked
            continue
        hit = table.filter(pc.equal(table.column("uniq_key"), uniq_key))
        if hit.num_rows:
            return hit.slice(0, 1).to_pylist()[0]
    return None


def delivered_row(folder: Path, uniq_key: str,
                  in_table: Callable[[str], dict | None]) -> dict | None:
    """The ledger row of a delivered message, from the spool or the table (`in_table`).

    The spool is read first. `LedgerSpool` deletes a file only after its rows are committed
    to the table, so a row that leaves the spool while we look is in the table by the time
    we read it; reading the table first can miss a row moving between the two."""
    row = spooled(folder, uniq_key)
    return row if row is not None else in_table(uniq_key)


class DeadLetterTable(DeltaBatchTable):
    """Every rejected record, beside the dead-letter topic: the record as it came (key,
    value, headers), why, and where it was on the intake."""

    name = "dead_letters"
    partition_by = ("dead_date",)

    def rows(self, sent: Sent, summary: BatchSummary) -> DataFrame | None:
        return self.select(sent.frame(), summary) if summary.count("dead") else None

    def select(self, sent: DataFrame, summary: BatchSummary) -> DataFrame:
        return (sent.filter(F.col("kind") == "dead").select(
            "uniq_key", "key", "value", "headers", "reason",
            F.col("ipart").alias("intake_partition"), F.col("ioff").alias("intake_offset"),
            "append_ms", F.col("sent_ms").alias("dead_ms"),
            F.lit(summary.batch_id).cast("long").alias("batch_id"),
            F.date_format(F.timestamp_millis("sent_ms"), "yyyy-MM-dd").alias("dead_date"),
        ))
