"""The wheel query's foreachBatch: each batch kept so the wheel runs once, written to the ready
topic, dead letters and cold tier, and held back when it begins after a stop was asked."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sinks import store
from sinks.base import BatchSummary
from sinks.kafka import intake_bodies
from sinks.ready import ReadySink
from state.errors import JobError

if TYPE_CHECKING:
    from sinks.cold import ColdTier
    from sinks.dead_letters import DeadLetterTable

log = logging.getLogger(__name__)


@dataclass
class BatchWriter:
    """References go to the ready topic in one Spark job; dead letters and cold parks get their
    bodies read back from the intake (`with_bodies`) for the other sinks."""

    kafka: ReadySink
    intake: tuple[str, dict[str, str], str]   # the intake, Spark's Kafka options, the DLQ
    dead_letters: DeadLetterTable | None = None
    observers: list[Callable[[BatchSummary], None]] = field(default_factory=list)
    cold: "ColdTier | None" = None
    first: tuple[float, dict] | None = None   # the first call's start and step timings
    # For DelayJob.stop (`stopping`: when the query's stop was called, time.monotonic).
    begun: int | None = None
    closed: bool = False
    stopping: float | None = None
    parked: threading.Event = field(default_factory=threading.Event, repr=False)
    lost_kept_rows: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def close(self) -> int | None:
        """No batch begins after this call: the id of the last that did, or None."""
        with self._lock:
            self.closed = True
            return self.begun

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            closed = self.closed
            if not closed:
                self.begun = batch_id
        if closed:
            self.parked.set()
            wait_for_the_stop(batch.sparkSession, batch_id, lambda: self.stopping)
        batch, release = kept(batch)
        releases = [release]
        clock = time.monotonic()
        timings: dict[str, float] = {}
        if self.first is None:
            self.first = (clock, timings)

        def lap(step: str) -> None:
            nonlocal clock
            now = time.monotonic()
            timings[step] = round(now - clock, 3)
            clock = now
        try:
            self._write(batch, BatchSummary(batch_id, timings=timings), lap, releases)
        except Exception as e:
            if LOST_KEPT_ROWS in error_conditions(e):
                self.lost_kept_rows = True
            raise
        finally:
            for drop in reversed(releases):
                drop()

    def _write(self, batch: DataFrame, summary: BatchSummary, lap: Callable[[str], None],
               releases: list) -> None:
        self.kafka.write_batch(batch, summary,
                               self.cold.loaded_until() if self.cold is not None else None)
        lap("kafka")
        bodied = None
        if summary.count("dead") or summary.count("cold"):
            bodied, release_bodied = self.with_bodies(batch, summary)
            releases.append(release_bodied)
            lap("bodies")
        if summary.count("dead"):
            self.kafka.write_dead(bodied)
            lap("dead")
        if self.cold is not None:
            self.cold.park(batch, bodied, summary)
            self.cold.advance(summary)
            lap("cold")
        if summary.count("dead") and self.dead_letters is not None:
            dead = bodied.filter(F.col("kind") == "dead").withColumn(
                "sent_ms", F.lit(int(time.time() * 1000)).cast("long"))
            self.dead_letters.write_batch(dead, summary.batch_id)
            lap("dead_letters")
        for observe in self.observers:
            observe(summary)

    def with_bodies(self, batch: DataFrame,
                    summary: BatchSummary) -> tuple[DataFrame, Callable[[], None]]:
        """Dead and cold rows with their intake records, kept. A cold row whose record is gone
        becomes a dead letter (`intake_record_gone`, so counted): no empty message is parked."""
        topic, options, dlq = self.intake
        rows = intake_bodies(batch.filter(F.col("kind").isin("dead", "cold")), topic, options)
        lost = (F.col("kind") == "cold") & F.col("found").isNull()
        gone = F.concat(F.lit("intake_record_gone: intake record "), F.col("ipart").cast("string"),
                        F.lit("-"), F.col("ioff").cast("string"), F.lit(" of "),
                        F.col("uniq_key"), F.lit(" was deleted before the cold tier took it"))
        # One projection: each expression reads the rows' columns as they were.
        bodied, release = kept(rows.withColumns({
            "kind": F.when(lost, F.lit("dead")).otherwise(F.col("kind")),
            "topic": F.when(lost, F.lit(dlq)).otherwise(F.col("topic")),
            "reason": F.when(lost, gone).otherwise(F.col("reason")), "lost": lost}))
        if summary.count("cold"):
            for row in bodied.filter("lost").groupBy("level").count().collect():
                summary.recount("cold", "dead", row["count"])
                summary.dead_by_reason["intake_record_gone"] += row["count"]
                summary.pending_delta_by_level[row["level"]] -= row["count"]
        return bodied, release


# Past STOP_WAIT_MS the batch fails, having sent nothing (the stop comes within its grace).
STOP_WAIT_MS = 10 * 60 * 1000
STOP_SLICE_MS = 500
STOP_INTERRUPT_AFTER_S = 1.0


def wait_for_the_stop(spark: SparkSession, batch_id: int,
                      stopping: Callable[[], float | None] = lambda: None,
                      clock: Callable[[], float] = time.monotonic) -> None:
    """Wait in the JVM, on the query's thread, until the stop interrupts it: Spark takes that as
    a clean stop (SPARK-39218), the batch not committed. Spark interrupts once, maybe while the
    thread is elsewhere, so it also interrupts itself STOP_INTERRUPT_AFTER_S after `stopping()`."""
    jvm = store.jvm(spark)
    deadline = clock() + STOP_WAIT_MS / 1000
    try:
        while clock() < deadline:
            asked = stopping()
            if asked is not None and clock() - asked >= STOP_INTERRUPT_AFTER_S:
                jvm.java.lang.Thread.currentThread().interrupt()
            jvm.java.lang.Thread.sleep(STOP_SLICE_MS)
    except Exception as e:   # the stop's interruption, which Spark must see as it is
        e.delayq_stop = True
        raise
    raise JobError(f"batch {batch_id} waited {STOP_WAIT_MS // 1000} s for the job's stop")


class _QuietStop(logging.Filter):
    """py4j logs a clean stop's interruption at ERROR with its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, "delayq_stop", False)


logging.getLogger("py4j.clientserver").addFilter(_QuietStop())


def kept(batch: DataFrame) -> tuple[DataFrame, Callable[[], None]]:
    """The batch computed once and kept (the wheel must not run twice), and its release. A lazy
    local checkpoint, not the cache (which copies payloads twice); never recomputed: lost blocks
    fail the job and the batch runs again from the checkpoint."""
    kept = batch.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)
    # Released via its RDD, as PySpark cannot (5b2c265: 13.1-15.8k msg/s vs 9.9-11.8k persisting).
    rows = kept._jdf.queryExecution().logical().rdd()

    def release() -> None:
        # Best effort: failing a sent batch for a stop's interruption would resend it all.
        try:
            rows.unpersist(False)
        except Exception as e:
            log.warning("could not drop a batch's kept rows: %s", str(e).splitlines()[0])
    return kept, release


LOST_KEPT_ROWS = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


def error_conditions(error) -> set[str]:
    """Spark error conditions along a Py4JJavaError's JVM causes, or a converted exception's
    own. foreachBatch must read them: past it, the error is only a traceback's text."""
    java = getattr(error, "java_exception", None)   # a Py4JJavaError's JVM throwable
    if java is None:
        with contextlib.suppress(Exception):   # not a converted Spark exception
            return {error.getCondition()} - {None, ""}
        return set()
    found: set[str | None] = set()
    for _ in range(20):
        if java is None:
            break
        with contextlib.suppress(Exception):   # no SparkThrowable
            found.add(java.getCondition())
        java = java.getCause()
    return found - {None, ""}
