"""The wheel query: intake → parse → wheel (applyInPandasWithState, state/wheel.py) → the
ready topic, written by `BatchWriter` once per batch; and the reads of its state
(`pending_by_level`, `wheel_state`). The wheel's Python sees each record's position, append
time and control headers, never its key, value or user headers: it holds and fires references,
and the bodies a batch needs itself (dead letters, cold parks) are read back in the JVM
(sinks/kafka.py intake_bodies).
"""
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
from pyspark.sql.streaming.state import GroupStateTimeout

from conf.settings import Settings
from sinks import store
from sinks.base import BatchSummary
from streaming.dispatch.direct import WHEEL_HEADERS, direct_values
from sinks.kafka import intake_bodies
from sinks.ready import ReadySink
from state import headers as H
from state.envelope import Rules
from state.errors import JobError
from state.parse import make_parser
from state.columns import REFS_DDL
from state.wheel import WheelConfig, make_wheel
from streaming.kafka.config import spark_options
from streaming.wheel.schema import INDEX_ENVELOPE_SPARK, STATE_SPARK, WHEEL_OUT_SPARK

if TYPE_CHECKING:
    from sinks.cold import ColdTier
    from sinks.dead_letters import DeadLetterTable

log = logging.getLogger(__name__)


def rules_of(settings: Settings) -> Rules:
    return Rules(
        level_delays_ms=settings.level_delays_ms,
        intake_topic=settings.intake_topic,
        dlq_topic=settings.dlq_topic,
        allowed_topics=settings.allowed_topic_set,
        max_delay_ms=settings.max_delay_ms,
        clock_tolerance_ms=settings.clock_tolerance_ms,
        near_horizon_ms=settings.near_horizon_ms,
        cold_bucket_ms=settings.cold_bucket_ms,
        timer_parts=settings.timer_parts,
    )


def wheel_config_of(settings: Settings, first_watermark_ms: int = 0) -> WheelConfig:
    return WheelConfig(
        slot_ms=settings.slot_ms,
        lead_ms=settings.fire_lead_ms,
        lead_per_message_us=settings.fire_lead_per_message_us,
        watermark_delay_ms=settings.late_tolerance_ms,
        first_watermark_ms=first_watermark_ms,
        dlq_topic=settings.dlq_topic,
        timer_parts=settings.timer_parts,
    )


def intake_stream(spark: SparkSession, settings: Settings) -> DataFrame:
    reader = (spark.readStream.format("kafka")
              .options(**spark_options(settings))
              .option("subscribe", settings.intake_topic)
              .option("startingOffsets", "earliest")
              .option("includeHeaders", "true")
              # A producer's transaction that aborted its intake writes: never delivered (the
              # dispatch tasks' intake reads are read_committed too, streaming/dispatch/supervisor.py).
              .option("kafka.isolation.level", "read_committed")
              # Intake data deleted before it was read is a loss: stop and say so.
              .option("failOnDataLoss", "true"))
    if settings.max_offsets_per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    return reader.load().select(
        "key", "value",
        F.col("partition").alias("ipart"),
        F.col("offset").alias("ioff"),
        F.unix_millis("timestamp").alias("append_ms"),
        "headers",
    )


def wheel_stream(spark: SparkSession, settings: Settings, source: DataFrame | None = None,
                 overdue_before_ms: int = 0, first_watermark_ms: int = 0) -> DataFrame:
    """The fired output of the wheel: rows of the WHEEL_OUT layout, once per batch. `source`,
    in the layout of `intake_stream`, replaces the intake topic (the class data training).
    Level messages due before `overdue_before_ms` pass through without state (the
    checkpoint's first start: `streaming.wheel.checkpoint.started_ms`); `first_watermark_ms` stands
    in for a new query's missing watermark (`WheelConfig`). Both 0: neither."""
    spread = settings.spark_shuffle_partitions
    source = intake_stream(spark, settings) if source is None else source
    rules = rules_of(settings)
    direct = direct_values(rules, settings.dispatch_direct_max_delay_ms)
    parsed = index_of(source.filter(~direct_column(direct)) if direct else source).mapInArrow(
        make_parser(rules, settings.slot_ms, spread, overdue_before_ms=overdue_before_ms),
        INDEX_ENVELOPE_SPARK)
    timed = (parsed.withColumn("event_time", F.timestamp_millis("append_ms"))
             .withWatermark("event_time", f"{settings.late_tolerance_ms} milliseconds"))
    config = wheel_config_of(settings, first_watermark_ms)
    return timed.groupBy("bucket", "slot").applyInPandasWithState(
        make_wheel(config), WHEEL_OUT_SPARK, STATE_SPARK, "append",
        GroupStateTimeout.EventTimeTimeout)


def index_of(intake: DataFrame) -> DataFrame:
    """What the wheel's parse reads of an intake record: its position, append time and control
    headers (the contract's; the user's are left in the JVM), no key and no value."""
    control = sorted(H.CONTROL_HEADERS)
    return intake.select("ipart", "ioff", "append_ms",
                         F.filter("headers", lambda h: h["key"].isin(*control)).alias("headers"))


def direct_column(values: frozenset[bytes]) -> F.Column:
    """streaming/dispatch/direct.py `is_direct` as a Spark column over the intake's headers: the records
    the dispatch tasks send themselves, which the wheel leaves out before its parse."""
    texts = sorted(v.decode() for v in values)
    wheel = F.exists("headers", lambda h: h["key"].isin(*sorted(WHEEL_HEADERS)) | (
        (h["key"] == H.DELAY) & ~F.coalesce(h["value"].cast("string").isin(*texts), F.lit(False))))
    return ~F.coalesce(wheel, F.lit(False))


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
            summary = BatchSummary(batch_id, timings=timings)
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
        except Exception as e:
            if LOST_KEPT_ROWS in error_conditions(e):
                self.lost_kept_rows = True
            raise
        finally:
            for drop in reversed(releases):
                drop()

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


def pending_by_level(spark: SparkSession, checkpoint: str,
                     batch_id: int | None = None) -> dict[int, int]:
    """Messages held in the checkpoint's wheel per level (bucket) as of committed batch
    `batch_id` (the last one when None), read with Spark's state data source; {} for a
    checkpoint without state."""
    root = store.path(checkpoint)
    if not (root / "state" / "0").is_dir() or not (root / "commits").is_dir():
        return {}
    groups = wheel_state(spark, checkpoint, batch_id, references=False)
    rows = groups.groupBy("bucket").agg(F.sum("count").alias("n")).collect()
    return {int(r["bucket"]): int(r["n"] or 0) for r in rows}


def wheel_state(spark: SparkSession, checkpoint: str, batch_id: int | None = None,
                references: bool = True) -> DataFrame:
    """The checkpoint's wheel state read with Spark's state data source, one row per group:
    bucket, slot, count and, with `references`, the group's references, a list per column
    (state/columns.py STATE and REFERENCE)."""
    spark.streams.active  # the state reader needs the state store coordinator
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    state = reader.load(checkpoint)
    held = "value.groupState"   # flatMapGroupsWithState's state format 2: (groupState, timeout)
    groups = state.where(F.col(f"{held}.count").isNotNull()).select(
        F.col("key.bucket").alias("bucket"), F.col("key.slot").alias("slot"),
        F.col(f"{held}.count").alias("count"), F.col(f"{held}.refs").alias("refs"))
    if not references:
        return groups.drop("refs")
    return groups.select("bucket", "slot", "count", F.from_json("refs", REFS_DDL).alias("r")) \
        .select("bucket", "slot", "count", "r.*")
