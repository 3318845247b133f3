"""The wheel's Kafka sink: every fired message goes to the ready topic (`<intake>.READY`)
with its restore information in trailing headers, for the dispatch tasks (sinks/dispatch.py) to
send at its due time; dead letters go straight to the dead-letter topic. A batch replayed after
a crash is written again (Spark's Kafka sink is at least once); the dispatch tasks skip the
deliveries the ledger already holds.

The ready partition of a row keeps what Kafka keeps in order on one path: the messages to one
(topic, REAL_QID), and one key's messages to one topic, go through one partition and so one
dispatch task, which sends them in due order. The rest spread by UNIQ_KEY. A batch writes each
ready partition from one task, its rows in due order: a dispatch task sends overdue rows as it
reads them (a restart's backlog), so they must come in due order too.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from sinks.base import BatchSummary
from sinks.dispatch import READY_FROM, READY_LEVEL, READY_QID, READY_TOPIC
from sinks.kafka import appended_headers, header_struct

# The kinds of the wheel's rows counted in a summary, besides dead letters and tallies.
_COUNTED_KINDS = ("deliver", "cold", "cancelled", "cancel_unknown")


def ready_lane(partitions: int) -> F.Column:
    """The ready partition of a delivery (see the module's docstring)."""
    n = F.lit(partitions)
    return (F.when(F.col("partition").isNotNull(), F.pmod(F.hash("topic", "partition"), n))
            .when(F.col("key").isNotNull(), F.pmod(F.hash("topic", "key"), n))
            .otherwise(F.pmod(F.hash("uniq_key"), n))).cast("int")


def ready_headers() -> F.Column:
    """The message's headers as delivered, then the restore headers the dispatch removes."""
    return appended_headers(
        header_struct(READY_TOPIC, F.col("topic")),
        header_struct(READY_QID, F.col("partition").cast("string")),
        header_struct(READY_LEVEL, F.col("level").cast("string")),
        header_struct(READY_FROM, F.concat_ws("-", "ipart", "ioff", "append_ms")))


def observed_counts() -> list[F.Column]:
    """What a write counts of its batch, as Spark aggregates computed in the write's own job
    (an Observation): the rows of each kind, each dead letter's reason and each tally row (a
    few per batch). Counted in the JVM, the rows are never moved to Python and back."""
    kind = F.col("kind")
    return [*(F.count_if(kind == name).alias(name) for name in _COUNTED_KINDS),
            F.collect_list(F.when(kind == "dead", F.coalesce("reason", F.lit("")))).alias("dead"),
            F.collect_list(F.when(kind == "tally", F.struct(
                "level", "received", "pending_delta"))).alias("tally")]


def add_counts(seen: dict, summary: BatchSummary) -> None:
    """An Observation's counts (`observed_counts`) into the batch's summary. Deliveries are
    counted as fired, not delivered: the ledger query counts them once the dispatch sent them."""
    for name in _COUNTED_KINDS:
        if seen.get(name):
            summary.add(name, None, None, seen[name], delivered=False)
    for reason in seen.get("dead") or []:
        summary.add("dead", None, reason or None, 1)
    for row in seen.get("tally") or []:
        summary.add("tally", row["level"], None, 1, row["received"] or 0,
                    row["pending_delta"] or 0)


class ReadySink:
    """The wheel batch's one write: its columns, filter and counts built once."""

    def __init__(self, options: dict[str, str], ready_topic: str, partitions: int,
                 max_request_bytes: int = 1_048_576):
        deliver = F.col("kind") == "deliver"
        self._sent = [
            F.when(deliver, F.lit(ready_topic)).otherwise(F.col("topic")).alias("topic"),
            F.when(deliver, F.col("lane")).otherwise(F.col("partition")).alias("partition"),
            F.col("key"), F.col("value"),
            F.when(deliver, ready_headers()).otherwise(F.col("headers")).alias("headers"),
        ]
        self._counts = observed_counts()
        self._partitions = partitions
        self._written = F.col("kind").isin("deliver", "dead")   # the rows a batch writes
        self._lane = F.when(deliver, ready_lane(partitions))
        self._options = {"kafka.max.request.size": str(max_request_bytes), **options}

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> Callable[[], DataFrame]:
        """Fired rows to the ready topic and dead letters to theirs, in the batch's one Spark
        job, every row counted into `summary` on the way (`observed_counts`). Returns the sent
        rows (the batch's columns and `sent_ms`), built on first call: most batches never need
        them (dead letters are rare), and building them costs the driver an analysis of the
        micro-batch's whole plan."""
        seen = Observation()
        (batch.observe(seen, *self._counts).filter(self._written)
         .withColumn("lane", self._lane).repartition(self._partitions, "lane")
         .sortWithinPartitions("due_ms").select(*self._sent)
         .write.mode("append").format("kafka").options(**self._options).save())
        add_counts(seen.get, summary)
        now_ms = int(time.time() * 1000)
        return functools.cache(lambda: batch.filter(self._written)
                               .withColumn("sent_ms", F.lit(now_ms).cast("long")))
