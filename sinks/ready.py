"""The wheel's Kafka sink: every fired reference goes to the ready topic (`<intake>.READY`),
for the dispatch tasks (streaming/dispatch/rules.py) to read its body back from the intake and send it at
its due time; dead letters go to the dead-letter topic with their record read back. A batch
replayed after a crash is written again (Spark's Kafka sink is at least once): each reference's
key is its batch's id, by which the dispatch tasks know a copy (streaming/dispatch/rules.py Refired).

A reference's ready partition is its intake partition's, modulo the ready partitions: the
dispatch task of ready partition p reads back from the intake partitions q with q mod (ready
partitions) = p, the ones it reads for the short levels too (streaming/dispatch/direct.py), so each intake
partition has one sender and its reads stay in offset order. A batch writes each ready
partition from one task, in due order (then intake position): a dispatch task sends overdue rows
as it reads them (a restart's backlog), so they must come in due order too.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from sinks.base import BatchSummary
from sinks.kafka import appended_headers, header_struct
from state import headers as H

# The kinds of the wheel's rows counted in a summary, besides dead letters and tallies.
_COUNTED_KINDS = ("deliver", "cold", "cancelled", "cancel_unknown")


def reference_value() -> F.Column:
    """A fired reference as the dispatch reads it (streaming/dispatch/rules.py ready_row): one record
    value, "<due ms>,<level>,<intake partition>,<intake offset>,<append ms>,<UNIQ_KEY>", with no
    key and no header (one split to read; four headers cost the task a third of its read)."""
    return F.encode(F.concat_ws(",", *(F.col(name).cast("string") for name in (
        "due_ms", "level", "ipart", "ioff", "append_ms", "uniq_key"))), "UTF-8")


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
    """The wheel batch's writes: its references (with every row counted, in the batch's one
    Spark job) and its dead letters (with their records read back, when it has any)."""

    def __init__(self, options: dict[str, str], ready_topic: str, partitions: int,
                 max_request_bytes: int = 1_048_576):
        self._sent = [F.lit(ready_topic).alias("topic"),
                      F.pmod("ipart", F.lit(partitions)).cast("int").alias("partition"),
                      reference_value().alias("value")]
        self._counts = observed_counts()
        self._partitions = partitions
        self._options = {"kafka.max.request.size": str(max_request_bytes), **options}

    def write_batch(self, batch: DataFrame, summary: BatchSummary) -> None:
        """Fired references to the ready topic, keyed by the batch's id, in the batch's one
        Spark job, every row counted into `summary` on the way (`observed_counts`)."""
        key = F.encode(F.lit(str(summary.batch_id)), "UTF-8").alias("key")
        seen = Observation()
        (batch.observe(seen, *self._counts).filter(F.col("kind") == "deliver")
         .repartition(self._partitions, F.pmod("ipart", F.lit(self._partitions)))
         .sortWithinPartitions("due_ms", "ipart", "ioff").select(*self._sent, key)
         .write.mode("append").format("kafka").options(**self._options).save())
        add_counts(seen.get, summary)

    def write_dead(self, rows: DataFrame) -> None:
        """Dead letters (rows of WITH_BODY) to the dead-letter topic: their records as they came,
        then DLQ_REASON."""
        (rows.filter(F.col("kind") == "dead")
         .select("topic", F.lit(None).cast("int").alias("partition"), "key", "value",
                 appended_headers(header_struct(H.DLQ_REASON, F.col("reason"))).alias("headers"))
         .write.mode("append").format("kafka").options(**self._options).save())
