"""The Kafka sink: delivered messages to their real topics, rejected ones to the dead-letter
topic. At-least-once: a replayed batch sends its messages again, with the same UNIQ_KEY.

Before writing it checks every real topic against the cluster's metadata: a message for a
topic that does not exist, for a partition beyond the topic's last, or larger than the topic
takes (max.message.bytes), becomes a dead letter with its reason, instead of failing the
Kafka writer, and with it this batch and every replay of it.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pyspark import AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from sinks.base import BatchSink, BatchSummary, Sent  # noqa: F401
from state import headers as H
from state.hold import hold_until_due

# Send as soon as a held row is released: lateness, not throughput, is what this writer buys.
PRODUCER_OPTIONS = {"kafka.linger.ms": "1", "kafka.acks": "all", "kafka.max.block.ms": "30000"}
# Kafka's bound for one record written alone: batch header (DefaultRecordBatch, 61 bytes),
# record header (DefaultRecord.MAX_RECORD_OVERHEAD, 21), varint lengths of key, value and the
# header count (5 each), and per header its two varint lengths (10).
_BATCH_OVERHEAD = 61 + 21 + 15
_HEADER_OVERHEAD = 10


@functools.cache
def outgoing_rows() -> F.Column:
    """The rows the Kafka write sends; built once (each Column costs calls into the JVM)."""
    return F.col("kind").isin("deliver", "dead")


def record_size() -> F.Column:
    """The bytes Kafka counts against max.message.bytes for this row, at most (uncompressed)."""
    headers = F.aggregate(
        F.coalesce("headers", F.array().cast("array<struct<key:string,value:binary>>")),
        F.lit(0).cast("long"),
        lambda acc, h: acc + F.octet_length(h["key"])
        + F.coalesce(F.octet_length(h["value"]), F.lit(0)) + _HEADER_OVERHEAD)
    return (F.lit(_BATCH_OVERHEAD) + F.coalesce(F.octet_length("key"), F.lit(0))
            + F.coalesce(F.octet_length("value"), F.lit(0)) + headers)


@dataclass
class Refusals:
    """Deliveries the cluster cannot take, decided once on the driver from the batch's
    aggregate: whole (topic, partition) pairs with their reason, and per topic the largest
    record it takes, for topics where some row of the batch is larger."""

    pairs: dict[tuple[str, int | None], str] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.pairs or self.limits)


def header_struct(name: str, value: F.Column) -> F.Column:
    """A Kafka header (name, UTF-8 text of a column), as Spark's Kafka sink takes it."""
    return F.struct(F.lit(name).alias("key"), F.encode(value, "UTF-8").alias("value"))


class KafkaSink(BatchSink):
    name = "kafka"

    def __init__(self, options: dict[str, str], dlq_topic: str, catalog, parallelism: int,
                 max_request_bytes: int = 1_048_576):
        # The producer must take the largest record the dead-letter topic takes.
        self._max_request = max_request_bytes
        self._options = {**PRODUCER_OPTIONS, "kafka.max.request.size": str(max_request_bytes),
                         **options}
        self._dlq = dlq_topic
        self._catalog = catalog
        self._parallelism = max(1, parallelism)
        self._reports = None   # the hold tasks' reports (write_batch)
        self._schema = None    # the hold's output layout (write_batch)

    def topic_sizes(self, topics) -> dict[str, int | None]:
        """Partition count of each real topic (None: the topic does not exist)."""
        return self._catalog.partitions(sorted(topics))

    def plan(self, rows) -> Refusals:
        """Refusals for a batch, from its aggregate rows (kind, topic, partition, largest)."""
        deliveries = [r for r in rows if r["kind"] == "deliver"]
        sizes = self.topic_sizes({r["topic"] for r in deliveries}) if deliveries else {}
        refusals = Refusals()
        for row in deliveries:
            topic, part = row["topic"], row["partition"]
            why = self.refusal(topic, part, sizes)
            if why:
                refusals.pairs[(topic, part)] = why
                continue
            limit = min(self._catalog.max_message_bytes(topic) or self._max_request,
                        self._max_request)
            if (row["largest"] or 0) > limit:
                refusals.limits[topic] = limit
        return refusals

    @staticmethod
    def refusal(topic: str, partition: int | None, sizes: dict[str, int | None]) -> str | None:
        """The dead-letter reason for a delivery the cluster cannot take, else None."""
        size = sizes.get(topic)
        if size is None:
            return f"REAL_TOPIC '{topic}' does not exist"
        if partition is not None and partition >= size:
            return f"REAL_QID {partition} is out of range: topic '{topic}' has {size} partitions"
        return None

    def refuse(self, batch: DataFrame, refusals: Refusals) -> DataFrame:
        """Turn the batch's deliveries the cluster refuses into dead letters: those to the
        refused (topic, partition) pairs, and those larger than their topic takes. The
        decisions come from `plan`, so the rule lives in one place."""
        if not refusals:
            return batch
        place = F.concat_ws("|", "topic", F.coalesce(F.col("partition").cast("string"), F.lit("")))
        pair_reason = F.lit(None).cast("string")
        if refusals.pairs:
            pairs = [x for (topic, part), why in refusals.pairs.items()
                     for x in (F.lit(f"{topic}|{'' if part is None else part}"), F.lit(why))]
            pair_reason = F.try_element_at(F.create_map(*pairs), place)
        size_reason = F.lit(None).cast("string")
        if refusals.limits:
            limits = F.create_map(*[x for topic, limit in refusals.limits.items()
                                    for x in (F.lit(topic), F.lit(limit))])
            limit = F.try_element_at(limits, F.col("topic"))
            size_reason = F.when(record_size() > limit, F.format_string(
                "message of %d bytes is too large for topic '%s' (it takes %d)",
                record_size(), F.col("topic"), limit))
        reason = F.when(F.col("kind") == "deliver", F.coalesce(pair_reason, size_reason))
        extra = F.filter(F.array(
            header_struct(H.REAL_TOPIC, F.col("topic")),
            header_struct(H.REAL_QID, F.col("partition").cast("string")),
            header_struct(H.DLQ_REASON, F.col("_refused")),
        ), lambda h: h["value"].isNotNull())
        refused = F.col("_refused").isNotNull()
        return (batch.withColumn("_refused", reason)
                .withColumn("headers", F.when(refused, F.concat("headers", extra))
                            .otherwise(F.col("headers")))
                .withColumn("kind", F.when(refused, F.lit("dead")).otherwise(F.col("kind")))
                .withColumn("reason", F.coalesce("_refused", "reason"))
                .withColumn("topic", F.when(refused, F.lit(self._dlq)).otherwise(F.col("topic")))
                .withColumn("partition", F.when(refused, F.lit(None).cast("int"))
                            .otherwise(F.col("partition")))
                .withColumn("due_ms", F.when(refused, F.lit(0).cast("long"))
                            .otherwise(F.col("due_ms")))
                .drop("_refused"))

    def warm_up(self, spark, intake_topic: str) -> None:
        """Write one heartbeat to the intake through this sink's Kafka writer, so the first
        batch with deliveries does not also pay for creating the executors' producer."""
        from state import headers as H

        (spark.createDataFrame([(intake_topic, 0, None, b"", [(H.HEARTBEAT, b"1")])],
                               "topic string, partition int, key binary, value binary, "
                               "headers array<struct<key:string,value:binary>>")
         .write.format("kafka").options(**self._options).save())

    @staticmethod
    def sent_schema(batch_schema: StructType) -> StructType:
        return StructType(batch_schema.fields + [StructField("sent_ms", LongType())])

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> Sent:
        """Send the batch's deliveries and dead letters, each at its due time. Returns what
        was sent, with `sent_ms`: the moment the hold released each row.

        The Kafka writer reads the hold's output directly, so each row goes out as it is
        released. (Persisting the output for the ledger made Spark build each partition whole
        before the writer read any of it: rows left in one burst when their task's last row
        was due; docs/benchmarks.md.)

        Each hold task reports through one accumulator what the driver needs afterwards,
        without running the hold again: its deliveries in the `RELEASED` columns with the
        moment each was released (`summary.released`, an Arrow table: the ledger's rows and
        the lateness histogram), and per level the moment it began releasing, from which the
        returned frame's `sent_ms` follows (the later of that and the row's due time).
        """
        out = batch.filter(outgoing_rows())
        if self._schema is None:   # the batch's layout is fixed: ask the JVM once
            self._schema = self.sent_schema(out.schema)
        schema = self._schema
        # One accumulator for the sink's life, emptied per batch: every task of the previous
        # write reported before its save returned, and a new one per batch would stay in
        # PySpark's registry for good.
        if self._reports is None:
            self._reports = out.sparkSession.sparkContext.accumulator(
                HoldReports.zero(None), HoldReports())
        reports, reports.value = self._reports, HoldReports.zero(None)
        # One task per level: a level's messages leave in due order (the hold sorts each
        # task's rows), which matters when a restart finds many overdue at once.
        (out.repartition(self._parallelism, "level")
         .mapInArrow(hold_reporting(reports), schema)
         .select("topic", "partition", "key", "value", "headers")
         .write.format("kafka").options(**self._options).save())
        began, summary.released = HoldReports.read(reports.value)
        # A row whose level no task reported (a dead letter without a level): the write's end.
        ended_ms = int(time.time() * 1000)

        def frame() -> DataFrame:
            fallback = F.lit(ended_ms).cast("long")
            release = (F.coalesce(F.element_at(F.create_map(*[
                x for level, ms in began.items() for x in (F.lit(level), F.lit(ms).cast("long"))]),
                F.col("level")), fallback) if began else fallback)
            return out.withColumn("sent_ms", F.greatest(F.col("due_ms"), release))
        return Sent(frame, out.sparkSession)


# A delivery's columns the driver keeps after the write, with `sent_ms`, the moment the hold
# released it: what the ledger records and the lateness histogram counts.
RELEASED = ("uniq_key", "topic", "partition", "level", "ipart", "ioff", "append_ms", "due_ms",
            "sent_ms")


class HoldReports(AccumulatorParam):
    """What the hold tasks of one write report: {"starts": level -> ms when a task began
    releasing that level's rows (the latest attempt's, should Spark run a task again),
    "rows": one Arrow IPC stream of RELEASED columns per task}. Spark applies the updates of
    an action's task once, from its successful attempt, so every delivery is in "rows" once."""

    @staticmethod
    def zero(value):
        return {"starts": {}, "rows": []}

    def addInPlace(self, value1, value2):
        for level, ms in value2["starts"].items():
            value1["starts"][level] = max(ms, value1["starts"].get(level, ms))
        value1["rows"].extend(value2["rows"])
        return value1

    @staticmethod
    def read(value) -> tuple[dict, pa.Table | None]:
        """(starts, the released deliveries as one table, or None if there were none)."""
        tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in value["rows"]]
        return value["starts"], pa.concat_tables(tables) if tables else None


def hold_reporting(reports) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """`hold_and_stamp`, reporting to the accumulator `reports` (HoldReports) the task's
    first release for every level it held and its deliveries' RELEASED columns."""
    def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        first, levels, delivered = None, set(), []
        for out in hold_and_stamp(batches):
            if first is None:
                first = out.column("sent_ms")[0].as_py()
            levels.update(pc.unique(out.column("level")).to_pylist())
            # The small columns only: filtering the whole chunk would copy its payloads.
            rows = out.select(list(RELEASED)).filter(pc.equal(out.column("kind"), "deliver"))
            if rows.num_rows:
                delivered.append(rows)
            yield out
        if first is None:
            return
        blobs = []
        if delivered:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, delivered[0].schema) as writer:
                for rows in delivered:
                    writer.write_batch(rows)
            blobs.append(sink.getvalue().to_pybytes())
        reports.add({"starts": {level: first for level in levels if level is not None},
                     "rows": blobs})
    return hold


def hold_and_stamp(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for chunk in hold_until_due(batches, flush=worker_output_flush()):
        stamped = chunk.append_column("sent_ms", pa.array(
            [int(time.time() * 1000)] * chunk.num_rows, pa.int64()))
        yield from stamped.to_batches()


def worker_output_flush() -> Callable[[], None]:
    """The flush of the Python worker's stream back to the JVM, when called inside a PySpark
    worker; else a no-op.

    PySpark writes a task's Arrow output through a 64 KiB buffer (`spark.buffer.size`) and
    flushes it when full or when the task ends, so a row the hold releases could wait there
    for the rows released after it, up to the end of the task (6 s in
    tests/integration/test_hold_flush.py, which checks both that the stream is found and that
    the row leaves at once). PySpark has no hook for a UDF to flush, so this finds the stream
    its worker loop writes to (`pyspark.worker.main(infile, outfile)`) on the calling stack."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(_WORKER_FILE):
            out = frame.f_locals.get("outfile")
            if callable(getattr(out, "flush", None)):
                return out.flush
        frame = frame.f_back
    return _no_flush


def _no_flush() -> None:
    pass


_WORKER_FILE = os.path.join("pyspark", "worker.py")
