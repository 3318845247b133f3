"""The Kafka sink: delivered messages to their real topics, rejected ones to the dead-letter
topic. At-least-once: a replayed batch sends its messages again, with the same UNIQ_KEY.

A message for a topic that does not exist, for a partition beyond the topic's last, or larger
than the topic takes (max.message.bytes) becomes a dead letter with its reason, instead of
failing the Kafka writer, and with it this batch and every replay of it. The write is the
batch's one Spark job: its hold tasks send the deliveries the topics already seen are known
to take (`clearance`) and count every row of the batch; the rest, rare, are checked against
the cluster's metadata and sent after them (`write_batch`).
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
from sinks.driver_hold import RELEASED, SPOOLED, hand_over
from state import headers as H
from state.columns import OUTPUT
from state.hold import by_due, hold_until_due
from state.placement import task_keys
from state.worker import settle

# Send as soon as a held row is released: lateness, not throughput, is what this writer buys.
# Batches of up to 256 KiB per partition (the Java client's default is 16 KiB, about fifteen
# 1 KiB records): linger stays 1 ms, so a record on its own leaves as before
# (tests/integration/test_hold_flush.py writes with these options), while a burst, a drain or
# a catch-up goes out in far fewer, larger batches. A burst of 500,000 was released in 37-39 s
# in five runs (256 KiB and 1 MiB alike; 49 s in one more) against 49-59 s in three, the broker
# using 7-17 CPU-s less; the raw pipe, which takes these options too, carried 30-50% more
# (docs/benchmarks.md, "The Kafka writer's batch size"). An open batch holds its whole buffer
# from the producer's 32 MiB (`buffer.memory`): a write to more than 128 partitions at once
# waits for an acknowledged batch before it opens another.
PRODUCER_OPTIONS = {"kafka.linger.ms": "1", "kafka.acks": "all", "kafka.max.block.ms": "30000",
                    "kafka.batch.size": str(256 * 1024)}
# Kafka's bound for one record written alone: batch header (DefaultRecordBatch, 61 bytes),
# record header (DefaultRecord.MAX_RECORD_OVERHEAD, 21), varint lengths of key, value and the
# header count (5 each), and per header its two varint lengths (10).
_BATCH_OVERHEAD = 61 + 21 + 15
_HEADER_OVERHEAD = 10


@functools.cache
def outgoing_rows() -> F.Column:
    """The rows the Kafka write sends; built once (each Column costs calls into the JVM)."""
    return F.col("kind").isin("deliver", "dead")


# The hold's column of rows it may send: deliveries the clearance passed, and every dead letter.
CLEAR = "_clear"
# What the hold counts the batch's rows by (the summary's counts, sinks/base.py).
COUNTED_BY = ("kind", "topic", "partition", "level", "reason")
_PAYLOAD = ("key", "value", "headers")
# What the Kafka writer takes of the hold's output.
KAFKA_COLUMNS = ("topic", "partition", "key", "value", "headers")


@functools.cache
def _counted_columns() -> tuple[F.Column, ...]:
    """The batch's columns as the hold takes them: a row that is not sent (a tally, a parked
    cold message, a cancel's outcome) is only counted there, so its payload stays behind
    instead of crossing the shuffle."""
    return tuple(F.when(outgoing_rows(), F.col(name)).alias(name) if name in _PAYLOAD
                 else F.col(name) for name in OUTPUT.names)


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
    """Deliveries the cluster cannot take, decided once on the driver from the aggregate of
    the deliveries the clearance did not pass: whole (topic, partition) pairs with their
    reason, and per topic the largest record it takes, for topics where some row is larger."""

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
                 max_request_bytes: int = 1_048_576, hold=None):
        # The driver's hold (sinks/driver_hold.py DriverHold), or None: the tasks hold.
        self.hold = hold
        # The producer must take the largest record the dead-letter topic takes.
        self._max_request = max_request_bytes
        self._options = {**PRODUCER_OPTIONS, "kafka.max.request.size": str(max_request_bytes),
                         **options}
        self._dlq = dlq_topic
        self._catalog = catalog
        self._parallelism = max(1, parallelism)
        self._write = None     # the hold and Kafka write's Java parts (_HoldWrite)
        self._clearance = None  # (metadata snapshot, its Column) (clearance)
        self._lanes = None      # (partition counts known, their Column) (lanes)

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

    def warm_up(self, spark, intake_topic: str, partition: int) -> None:
        write_heartbeat(spark, self._options, intake_topic, partition)

    @staticmethod
    def sent_schema(batch_schema: StructType) -> StructType:
        return StructType(batch_schema.fields + [StructField("sent_ms", LongType())])

    def clearance(self) -> F.Column:
        """True for a row the hold may send without asking the cluster: a dead letter, or a
        delivery to a topic already found, to a partition it has, no larger than it takes.
        Built from what `plan` has looked up so far (the topic's limit refreshed when its cache
        expires), and again only when that changes (each Column costs calls into the JVM)."""
        known = self._catalog.known()
        snapshot = tuple(sorted(
            (topic, parts, min(self._catalog.max_message_bytes(topic) or self._max_request,
                               self._max_request))
            for topic, parts in known.items()))
        if self._clearance is None or self._clearance[0] != snapshot:
            passes = F.col("kind") != "deliver"
            if snapshot:
                parts = F.try_element_at(F.create_map(*[
                    x for topic, n, _ in snapshot for x in (F.lit(topic), F.lit(n))]), F.col("topic"))
                limit = F.try_element_at(F.create_map(*[
                    x for topic, _, n in snapshot for x in (F.lit(topic), F.lit(n).cast("long"))]),
                    F.col("topic"))
                passes = passes | (parts.isNotNull()
                                   & (F.col("partition").isNull() | (F.col("partition") < parts))
                                   & (record_size() <= limit))
            self._clearance = (snapshot, F.coalesce(passes, F.lit(False)))
        return self._clearance[1]

    def lanes(self) -> F.Column:
        """`hold_lane` over the partition counts looked up so far; built again only when they
        change."""
        known = tuple(sorted(self._catalog.known().items()))
        if self._lanes is None or self._lanes[0] != known:
            self._lanes = (known, hold_lane(dict(known), self._parallelism))
        return self._lanes[1]

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> Sent:
        """Send the batch's deliveries and dead letters, each at its due time, and count every
        row of the batch into `summary`. Returns what was sent, with `sent_ms`: the moment the
        hold released each row.

        Where the sink has the driver's hold (sinks/driver_hold.py), the tasks send only what
        is due already and hand the rest to the driver, which spools it before the batch
        commits and sends each row at its due time after the batch: the batch no longer lasts
        until its last fired row is due. Its deliveries are then counted as delivered, and
        their ledger rows and lateness recorded, once Kafka has them all (`summary.deferred`).

        This is the batch's one Spark job: it computes the batch (which `kept` keeps for any
        later reader), and its hold tasks count every row by COUNTED_BY as they go, so no job
        of its own counts the batch. A delivery the clearance does not pass (a topic not seen
        yet, or one whose partition or size the known metadata refuses) is counted but not
        sent; the driver then asks the cluster about those alone (`plan`), turns the refused
        ones into dead letters (`refuse`) and sends them in a second job, after the first.
        Until the sink has looked up any topic, a batch takes the old path instead: an
        aggregate job, `plan` and `refuse` first, then the one write.
        """
        if self._catalog.known():
            clear = self.clearance()
        else:
            # Nothing looked up yet (a job's first batches): an aggregate job looks up the
            # batch's topics and refuses what they cannot take before the one write, or every
            # delivery of a drain or of a restart on a backlog would wait for a second write
            # (a drain of 200,000 spent 8.4 s of its 22.8 s so).
            clock = time.monotonic()
            batch = self.refuse(batch, self.plan(aggregate(batch)))
            clear = F.lit(True)
            summary.timings["kafka_lookup"] = round(time.monotonic() - clock, 3)
        defer = self.hold is not None
        counts, began, released, later, files, sent = self._hold_and_write(
            self._writer(batch.sparkSession, defer).counted(batch, clear), self.lanes(), defer)
        frames = [lambda: self._sent_frame(batch.filter(outgoing_rows() & clear), began, sent)]
        withheld = 0
        for row in counts:
            if row["kind"] == "deliver" and not row[CLEAR]:
                withheld += row["count"]
            else:
                self._count(summary, row, delivered=not defer)
        tables = [released] if released is not None else []
        held = [later] if later is not None else []
        if withheld:
            clock = time.monotonic()
            rest = batch.filter((F.col("kind") == "deliver") & ~clear)
            refusals = self.plan(aggregate(rest))
            rest = self.refuse(rest, refusals)
            counts, began2, released2, later2, files2, sent2 = self._hold_and_write(
                rest.withColumn(CLEAR, F.lit(True)), self.lanes(), defer)
            for row in counts:
                self._count(summary, row, delivered=not defer)
            if released2 is not None:
                tables.append(released2)
            if later2 is not None:
                held.append(later2)
            files = files + files2
            frames.append(lambda: self._sent_frame(rest, began2, sent2))
            summary.timings["kafka_withheld"] = round(time.monotonic() - clock, 3)
        summary.released = (None if not tables else tables[0] if len(tables) == 1
                            else pa.concat_tables(tables))
        if defer:
            clock = time.monotonic()
            summary.deferred = True
            self.hold.put(summary.batch_id, summary.batch_time_ms,
                          pa.concat_tables(held) if held else None, sent=summary.released,
                          files=files)
            summary.timings["kafka_spool"] = round(time.monotonic() - clock, 3)

        def frame() -> DataFrame:
            built = [make() for make in frames]
            return built[0] if len(built) == 1 else built[0].unionByName(built[1])
        return Sent(frame, batch.sparkSession)

    @staticmethod
    def _count(summary: BatchSummary, row: dict, delivered: bool = True) -> None:
        summary.add(row["kind"], row["level"], row["reason"], row["count"],
                    row["received"] or 0, row["pending_delta"] or 0, delivered=delivered)
        if row["kind"] == "deliver":
            summary.topics.add(row["topic"])

    def _hold_and_write(self, rows: DataFrame, lane: F.Column, defer: bool = False):
        """One Kafka write of `rows` (the OUTPUT layout and CLEAR) through the hold, its tasks
        taking the rows by `lane` (`hold_lane`): returns
        the hold tasks' counts, the moment each level began releasing, the released deliveries
        (RELEASED columns, or None), the rows not yet due that the tasks left to the driver's
        hold when `defer` (driver_hold.SPOOLED columns, or None) and the files they handed
        them over in instead (names in the hold's hand-off folder), and when the write ended.

        The Kafka writer reads the hold's output directly, so each row goes out as it is
        released. (Persisting the output for the ledger made Spark build each partition whole
        before the writer read any of it: rows left in one burst when their task's last row
        was due; docs/benchmarks.md.)"""
        write = self._writer(rows.sparkSession, defer)
        reports = write.reports
        reports.value = HoldReports.zero(None)
        write.save(rows, lane)
        began, released, later = HoldReports.read(reports.value)
        return (HoldReports.counts(reports.value), began, released, later,
                HoldReports.files(reports.value), int(time.time() * 1000))

    def _writer(self, spark, defer: bool) -> "_HoldWrite":
        if self._write is None or self._write.defer != defer:
            handoff = self.hold.handoff_marker if defer and self.hold is not None else None
            self._write = _HoldWrite(spark, defer, self._parallelism, self._options, handoff)
        return self._write

    @staticmethod
    def _sent_frame(out: DataFrame, began: dict, ended_ms: int) -> DataFrame:
        """`out` with `sent_ms`: the later of a row's due time and the moment its level began
        releasing (the write's end for a row whose level no task reported: a dead letter
        without a level)."""
        fallback = F.lit(ended_ms).cast("long")
        release = (F.coalesce(F.element_at(F.create_map(*[
            x for level, ms in began.items() for x in (F.lit(level), F.lit(ms).cast("long"))]),
            F.col("level")), fallback) if began else fallback)
        return out.withColumn("sent_ms", F.greatest(F.col("due_ms"), release))


class _HoldWrite:
    """The Kafka write of `_hold_and_write` with its Java parts built once: the hold's Python
    function (pickled into the JVM once instead of every batch), its input columns, the
    repartition's column and the writer's options. PySpark's DataFrame methods rebuild each of
    them on every call (a list of columns costs one call into the JVM per column; `mapInArrow`
    pickles its function again and looks up every column of the DataFrame): about 40 ms of the
    driver's work per batch at 10,000 msg/s, between one batch's Spark job and the next
    (docs/benchmarks.md, "The driver's calls per batch"). Here a batch's write is a few calls.

    One accumulator for the sink's life, emptied per write: every task of the previous write
    reported before its save returned, and a new one per batch would stay in PySpark's
    registry for good."""

    def __init__(self, spark, defer: bool, parallelism: int, options: dict[str, str],
                 handoff: str | None = None):
        from pyspark.sql.classic.column import _to_seq
        from pyspark.sql.pandas.functions import pandas_udf
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.rdd import PythonEvalType

        sc = spark.sparkContext
        self.defer = defer
        self.reports = sc.accumulator(HoldReports.zero(None), HoldReports())
        hold = pandas_udf(hold_reporting(self.reports, defer, KAFKA_COLUMNS, handoff),
                          returnType=from_arrow_schema(pa.schema(
                              [OUTPUT.field(name) for name in KAFKA_COLUMNS])),
                          functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        # Over the input's columns by name: resolved against each batch's rows by Spark.
        self._hold = hold(*[F.col(name) for name in (*OUTPUT.names, CLEAR)])._jc
        self._seq = functools.partial(_to_seq, sc)
        self._lane = self._by_lane = None
        self._clear = self._select = None
        self._parallelism = parallelism
        self._options = spark._jvm.java.util.HashMap()
        for key, value in options.items():
            self._options.put(key, value)

    def counted(self, batch: DataFrame, clear: F.Column) -> DataFrame:
        """The batch's columns as the hold takes them (`_counted_columns`) and CLEAR."""
        if self._clear is not clear:   # a new clearance (the topics' metadata moved)
            self._select = self._seq([c._jc for c in (*_counted_columns(), clear.alias(CLEAR))])
            self._clear = clear
        return DataFrame(batch._jdf.select(self._select), batch.sparkSession)

    def save(self, rows: DataFrame, lane: F.Column) -> None:
        """Through the hold into Kafka, each row in the task `lane` names (`hold_lane`): the
        hold sorts each task's rows, so the rows Kafka keeps in order leave in due order, which
        matters when a restart finds many overdue at once."""
        if self._lane is not lane:
            self._by_lane = self._seq([lane._jc])
            self._lane = lane
        held = rows._jdf.repartition(self._parallelism, self._by_lane).mapInArrow(
            self._hold, False, None)
        held.write().mode("append").format("kafka").options(self._options).save()


def hold_lane(partitions: dict[str, int], tasks: int) -> F.Column:
    """The hold task of a row, as the int `task_keys` gives for it. The rows whose order Kafka
    keeps go through one task, which sends them in due order: those to one partition (named by
    REAL_QID, or the only partition of a topic in `partitions`, the partition counts known),
    and those of one key (Kafka's producer puts a key in one partition). The rest, without a
    key to a topic of several partitions (or not looked up yet), whose partition Kafka's
    producer picks, spread over every task by UNIQ_KEY. A topic's partitions go to the tasks
    in turn, the keys by their hash.

    The tasks went by level before: a burst of one level, 500,000 messages due at one second,
    was held and written by one task while the other cores waited; over two tasks that stage
    took 11.5-14.2 s instead of 18.0-28.7, and a burst released early 14.8-16.1 s instead of
    27.6-27.7 (docs/benchmarks.md, "The hold's tasks by lane")."""
    n = F.lit(tasks)
    single = sorted(topic for topic, count in partitions.items() if count == 1)
    part = F.col("partition")
    if single:
        part = F.coalesce(part, F.when(F.col("topic").isin(*single), F.lit(0)))
    task = (F.when(part.isNotNull(), F.pmod(F.pmod(F.hash("topic"), n) + part, n))
            .when(F.col("key").isNotNull(), F.pmod(F.hash("topic", "key"), n))
            .otherwise(F.pmod(F.hash("uniq_key"), n)))
    return F.element_at(F.array(*[F.lit(k) for k in task_keys(tasks)]), task + 1)


class Counts(AccumulatorParam):
    """A list accumulator: the values tasks add (lists) concatenated (streaming/ledger_query.py
    counts its rows with it)."""

    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1


class HoldReports(AccumulatorParam):
    """What the hold tasks of one write report: {"starts": level -> ms when a task began
    releasing that level's rows (the latest of its tasks', and of their attempts' should Spark
    run a task again), "rows": one Arrow IPC stream of RELEASED columns per task, "later": one
    Arrow IPC stream per task of the rows it left to the driver's hold (driver_hold.SPOOLED
    columns), "files": the names of the files tasks wrote those rows to instead (in the hold's
    hand-off folder, driver_hold.hand_over), "counts": one dict per task and COUNTED_BY group
    of the rows it took (with CLEAR, "count", and the sums of "received" and "pending_delta")}.
    Spark applies the updates of an action's task once, from its successful attempt, so every
    row is counted once and every delivery is in "rows", "later" or "files" once."""

    @staticmethod
    def zero(value):
        return {"starts": {}, "rows": [], "later": [], "files": [], "counts": []}

    def addInPlace(self, value1, value2):
        for level, ms in value2["starts"].items():
            value1["starts"][level] = max(ms, value1["starts"].get(level, ms))
        for name in ("rows", "later", "files", "counts"):
            value1[name].extend(value2[name])
        return value1

    @staticmethod
    def read(value) -> tuple[dict, pa.Table | None, pa.Table | None]:
        """(starts, the released deliveries as one table, the rows left to the driver's hold
        as one table; a table is None where there were no rows)."""
        def table(blobs):
            tables = [pa.ipc.open_stream(pa.py_buffer(blob)).read_all() for blob in blobs]
            return pa.concat_tables(tables) if tables else None
        return value["starts"], table(value["rows"]), table(value["later"])

    @staticmethod
    def counts(value) -> list[dict]:
        return value["counts"]

    @staticmethod
    def files(value) -> list[str]:
        return value["files"]


def write_heartbeat(spark, options: dict[str, str], intake_topic: str, partition: int) -> None:
    """Write one heartbeat to the intake through a sink's Kafka writer (its warm-up), so the
    first batch with deliveries does not also pay for creating the executors' producer."""
    from state import headers as H

    (spark.createDataFrame([(intake_topic, partition, None, b"", [(H.HEARTBEAT, b"1")])],
                           "topic string, partition int, key binary, value binary, "
                           "headers array<struct<key:string,value:binary>>")
     .write.mode("append").format("kafka").options(**options).save())


def count_rows(batch: pa.RecordBatch) -> list[dict]:
    """A batch's rows counted by COUNTED_BY and CLEAR (True where the column is absent)."""
    keys = list(COUNTED_BY)
    table = pa.Table.from_batches([batch.select(keys + ["received", "pending_delta"])])
    table = table.append_column(CLEAR, batch.column(CLEAR) if CLEAR in batch.schema.names
                                else pa.array([True] * batch.num_rows))
    groups = table.group_by(keys + [CLEAR], use_threads=False).aggregate(
        [([], "count_all"), ("received", "sum"), ("pending_delta", "sum")])
    return [{**{k: row[k] for k in keys + [CLEAR]}, "count": row["count_all"],
             "received": row["received_sum"], "pending_delta": row["pending_delta_sum"]}
            for row in groups.to_pylist()]


def _sendable(batches: Iterator[pa.RecordBatch], counts: list) -> Iterator[pa.RecordBatch]:
    """The rows of `batches` the hold sends (deliveries and dead letters the clearance passed),
    in the OUTPUT layout; every row is counted into `counts` on the way."""
    for batch in batches:
        if not batch.num_rows:
            continue
        counts.extend(count_rows(batch))
        keep = pc.is_in(batch.column("kind"), value_set=_SENT_KINDS)
        if CLEAR in batch.schema.names:
            keep = pc.and_(keep, pc.fill_null(batch.column(CLEAR), False))
            batch = batch.select([name for name in batch.schema.names if name != CLEAR])
        batch = batch.filter(keep)
        if batch.num_rows:
            yield batch


_SENT_KINDS = pa.array(["deliver", "dead"], pa.string())


def hold_reporting(reports, defer: bool = False, columns: tuple[str, ...] | None = None,
                   handoff: str | None = None
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """`hold_and_stamp` over the rows it may send (`release_due` when `defer`), reporting to
    the accumulator `reports` (HoldReports) the counts of every row it took, the task's first
    release for every level it held, its deliveries' RELEASED columns, and the rows it left to
    the driver's hold: in a file of the hold's hand-off folder when the task sees the folder's
    marker, `handoff` (driver_hold.hand_over), else in the report itself. It yields `columns`
    of the rows it sends (all, stamped, when None): the Kafka write takes KAFKA_COLUMNS, and
    every other column would cross back to the JVM for nothing."""
    def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        first, levels, delivered, counts, later = None, set(), [], [], []
        rows = _sendable(batches, counts)
        for out in (release_due(rows, later) if defer else hold_and_stamp(rows)):
            if first is None:
                first = out.column("sent_ms")[0].as_py()
            levels.update(pc.unique(out.column("level")).to_pylist())
            # The small columns only: filtering the whole chunk would copy its payloads.
            rows = out.select(list(RELEASED)).filter(pc.equal(out.column("kind"), "deliver"))
            if rows.num_rows:
                delivered.append(rows)
            yield out if columns is None else out.select(list(columns))
        if not counts:
            return
        starts = {} if first is None else {level: first for level in levels if level is not None}
        name = hand_over(handoff, later) if later and handoff else None
        reports.add({"starts": starts, "rows": _ipc_blobs(delivered),
                     "later": [] if name else _ipc_blobs(later), "files": [name] if name else [],
                     "counts": counts})
    return hold


def _ipc_blobs(tables: list) -> list[bytes]:
    """Tables (or record batches) of one layout as one Arrow IPC stream: [] or [bytes]."""
    if not tables:
        return []
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write(table)
    return [sink.getvalue().to_pybytes()]


def release_due(batches: Iterator[pa.RecordBatch], later: list,
                clock: Callable[[], float] = time.time) -> Iterator[pa.RecordBatch]:
    """The driver's hold's split of a task's rows: those due by now leave at once, in due
    order, stamped as `hold_and_stamp` stamps them; the rest go to `later` (a table of
    driver_hold.SPOOLED columns), for the driver to send when due. Never early: a row leaves
    here only if its due time has passed."""
    rows = by_due(batches)
    if rows is None:
        return
    now_ms = int(clock() * 1000)
    end = int(rows.column("due_ms").to_numpy().searchsorted(now_ms, side="right"))
    if end < rows.num_rows:
        later.append(rows.slice(end).select(list(SPOOLED)))
    if end:
        due = rows.slice(0, end)
        yield from due.append_column("sent_ms", pa.array(
            [now_ms] * end, pa.int64())).to_batches()


@functools.cache
def _aggregate_columns() -> tuple[F.Column, ...]:
    """The aggregate's columns, built once per process: PySpark builds a Column with a call
    into the JVM per function, literal and lambda variable (about 350 for these)."""
    return (F.count("*").alias("count"), F.sum("received").alias("received"),
            F.sum("pending_delta").alias("pending_delta"),
            F.max(F.when(F.col("kind") == "deliver", record_size())).alias("largest"))


def aggregate(batch: DataFrame) -> list:
    """A batch's rows counted by COUNTED_BY, with the largest delivery's record size: what
    `plan` decides on. A Spark job of its own."""
    return batch.groupBy(*COUNTED_BY).agg(*_aggregate_columns()).collect()


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
