"""The wheel query's batch: written once per micro-batch by `BatchWriter` (its references to the
ready topic, then dead letters and cold parks), kept so the wheel runs once, and held back when
it begins after a stop was asked."""
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
    """foreachBatch: the batch kept (`kept`), its references written to the ready topic and
    every row counted in one Spark job; then, when it has dead letters or cold parks, their
    records read back from the intake (`with_bodies`) for the dead-letter topic, the cold tier
    and every other sink."""

    kafka: ReadySink
    intake: tuple[str, dict[str, str], str]   # the intake, Spark's Kafka options, the DLQ
    sinks: list[DeadLetterTable] = field(default_factory=list)
    observers: list[Callable[[BatchSummary], None]] = field(default_factory=list)
    cold: "ColdTier | None" = None
    first: tuple[float, dict] | None = None   # the first call's start and step timings
    # For DelayJob.stop: the last batch begun, whether no other may begin, when the query's
    # stop was called (time.monotonic), and whether a batch waits for it.
    begun: int | None = None
    closed: bool = False
    stopping: float | None = None
    parked: threading.Event = field(default_factory=threading.Event, repr=False)
    lost_kept_rows: bool = False   # a batch failed as its kept rows were lost (`kept`)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def close(self) -> int | None:
        """No batch begins its work after this call: the id of the last that did, or None."""
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
        # The batch's one Spark job: it computes the batch, writes what fired and counts
        # every row for the sinks and the metrics (sinks/ready.py).
        self.kafka.write_batch(batch, summary)
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
        if summary.count("dead"):
            now_ms = int(time.time() * 1000)
            dead = bodied.filter(F.col("kind") == "dead").withColumn(
                "sent_ms", F.lit(now_ms).cast("long"))
            for sink in self.sinks:
                sink.write_batch(lambda: dead, summary)
                lap(sink.name)
        for observe in self.observers:
            observe(summary)

    def with_bodies(self, batch: DataFrame,
                    summary: BatchSummary) -> tuple[DataFrame, Callable[[], None]]:
        """The batch's dead and cold rows with their intake records read back, kept (`kept`):
        the dead-letter topic, the cold tier and the dead-letter table read them. A cold row
        whose record is gone already (the intake's retention) becomes a dead letter
        (`intake_record_gone`), counted so in `summary`: no empty message is parked."""
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


# How long a batch begun after a stop was asked waits for it (DelayJob.stop asks for it within
# its grace period; past this the batch fails, having sent nothing), the slices it sleeps in, and
# how long into the stop it interrupts itself (wait_for_the_stop).
STOP_WAIT_MS = 10 * 60 * 1000
STOP_SLICE_MS = 500
STOP_INTERRUPT_AFTER_S = 1.0


def wait_for_the_stop(spark: SparkSession, batch_id: int,
                      stopping: Callable[[], float | None] = lambda: None,
                      clock: Callable[[], float] = time.monotonic) -> None:
    """A batch that began after a stop was asked sends nothing: it waits in the JVM, on the
    query's own thread (PySpark pins a callback's JVM calls to it), until the query's stop
    interrupts it. Spark takes that interruption as a clean stop (SPARK-39218); the batch is
    not committed, and runs again after the restart.

    Spark interrupts the thread once, and that can land while the thread is elsewhere; so the
    wait sleeps in slices and, once `stopping()` (when the query's stop was called, by `clock`)
    is STOP_INTERRUPT_AFTER_S old, interrupts itself: the same clean stop."""
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
    """py4j logs, at ERROR with its traceback, the interruption a batch waiting for the stop
    ends with: the expected end of a clean stop, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, "delayq_stop", False)


logging.getLogger("py4j.clientserver").addFilter(_QuietStop())


def kept(batch: DataFrame) -> tuple[DataFrame, Callable[[], None]]:
    """The batch computed once by its first action and kept for the next, and the call that
    drops it. The wheel must not run twice for one batch, so every sink reads the rows kept.

    They are kept as whole rows (a lazy local checkpoint, in memory and spilled to disk), not
    in Spark's cache, which copies every payload twice to build its columns. Unlike a cached
    batch, a kept one is never computed again: a job that finds its blocks lost (an executor
    gone) fails, and the batch runs again from the checkpoint (BatchWriter.lost_kept_rows)."""
    kept = batch.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)
    # PySpark cannot release a local checkpoint; its RDD through the JVM can (5b2c265: drain
    # 13.1-15.8k msg/s against 9.9-11.8k for persist/unpersist, three pairs).
    rows = kept._jdf.queryExecution().logical().rdd()

    def release() -> None:
        # Best effort: the batch is sent, and failing it for a stop's interruption of this RPC
        # would send it all again after the restart.
        try:
            rows.unpersist(False)
        except Exception as e:
            log.warning("could not drop a batch's kept rows: %s", str(e).splitlines()[0])
    return kept, release


# The Spark error condition of a kept batch whose blocks are gone (`kept`).
LOST_KEPT_ROWS = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


def error_conditions(error) -> set[str]:
    """The Spark error conditions (SparkThrowable's error classes) of an error as PySpark
    raises it in the driver: along the causes of a Py4JJavaError's JVM throwable (a failed
    Spark job's SparkException, which PySpark passes on as it is), or a converted Spark
    exception's own (PySpark keeps its causes in private fields). A foreachBatch function
    must read them itself: past it, its error reaches the query as a Python traceback's text."""
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
