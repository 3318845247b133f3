"""The wheel's Kafka sink: fired references to the ready topic, keyed by batch id (a replay writes
again; the dispatch knows a copy by it), and dead letters. Ready partition = intake partition mod
ready partitions (one sender per intake partition), in due order: overdue rows go out as read.
A cancel due within the direct window goes to the dispatch task too: the wheel's outcome of it
follows on the ready topic as a notice (streaming/dispatch/cancels.py)."""
from __future__ import annotations

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from sinks.base import BatchSummary
from sinks.kafka import appended_headers, header_struct
from state import headers as H

# The kinds of the wheel's rows counted in a summary, besides dead letters and tallies.
_COUNTED_KINDS = ("deliver", "cold", "cancelled", "cancel_unknown")


def reference_value() -> F.Column:
    """A fired reference as the dispatch reads it (streaming/dispatch/rules.py ready_row): one
    record value, "<due ms>,<level>,<intake partition>,<intake offset>,<append ms>,<UNIQ_KEY>",
    keyed by batch id (`Refired`), no header (four headers cost the task a third of its read)."""
    return F.encode(F.concat_ws(",", *(F.col(name).cast("string") for name in (
        "due_ms", "level", "ipart", "ioff", "append_ms", "uniq_key"))), "UTF-8")


def observed_counts(decided_elsewhere: F.Column) -> list[F.Column]:
    """What a write counts of its batch, as aggregates in the write's own job (an Observation),
    so rows never move to Python: rows of each kind (but the rows `decided_elsewhere`), dead
    letters' reasons and tally rows."""
    kind = F.col("kind")
    return [*(F.count_if((kind == name) & ~decided_elsewhere).alias(name)
              for name in _COUNTED_KINDS),
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
                 window_ms: int, ring_horizon_ms: int, bucket_ms: int,
                 max_request_bytes: int = 1_048_576):
        """`window_ms`: dispatch_direct_max_delay_ms (-1: none); `ring_horizon_ms`: the timers'
        the dispatch tasks take (Rules.ring_horizon_ms); `bucket_ms`: the cold tier's."""
        self._sent = [F.lit(ready_topic).alias("topic"),
                      F.pmod("ipart", F.lit(partitions)).cast("int").alias("partition"),
                      reference_value().alias("value")]
        self._window, self._ring, self._bucket = window_ms, ring_horizon_ms, bucket_ms
        self._partitions = partitions
        self._options = {"kafka.max.request.size": str(max_request_bytes), **options}

    def write_batch(self, batch: DataFrame, summary: BatchSummary,
                    loaded_until: int | None = None) -> None:
        """Fired references and notices of cancels to the ready topic keyed by batch id, in the
        batch's one Spark job, every row counted into `summary` on the way (`observed_counts`).
        A cancel the wheel found nothing for is the dispatch task's to count; one whose target's
        bucket is beyond `loaded_until` waits beside it in the cold tier (sinks/cold.py)."""
        key = F.encode(F.lit(str(summary.batch_id)), "UTF-8").alias("key")
        kind, due = F.col("kind"), F.col("due_ms")
        after = due - F.col("append_ms")
        notice = kind.isin("cancelled", "cancel_unknown") & F.lit(self._window >= 0) & (
            (after <= F.lit(self._window))
            | ((F.col("level") == F.lit(-1)) & (after <= F.lit(self._ring))))
        parked = F.lit(loaded_until is not None) & (
            due - F.pmod(due, F.lit(self._bucket)) > F.lit(loaded_until or 0))
        found_nothing = notice & (kind == "cancel_unknown") & ~parked
        outcome = F.when(found_nothing, F.lit(H.OPEN)).otherwise(F.lit(H.SETTLED))
        headers = F.when(notice, F.array(F.struct(F.lit(H.READY_CANCEL).alias("key"),
                                                  outcome.alias("value"))))
        seen = Observation()
        # Cold rows of a bucket already rolled (the wheel behind): the cold tier rolls them now.
        late_cold = F.lit(loaded_until is not None) & (kind == "cold") & ~parked
        (batch.observe(seen, *observed_counts(found_nothing),
                       F.count_if(late_cold).alias("cold_now"))
         .filter((kind == "deliver") | notice)
         .repartition(self._partitions, F.pmod("ipart", F.lit(self._partitions)))
         .sortWithinPartitions("due_ms", "ipart", "ioff")
         .select(*self._sent, key, headers.alias("headers"))
         .write.mode("append").format("kafka").options(**self._options).save())
        counts = seen.get
        add_counts(counts, summary)
        if counts["cold_now"]:
            summary.add("cold_now", None, None, counts["cold_now"])

    def write_dead(self, rows: DataFrame) -> None:
        """Dead letters (WITH_BODY rows) to the dead-letter topic, as they came plus DLQ_REASON."""
        (rows.filter(F.col("kind") == "dead")
         .select("topic", F.lit(None).cast("int").alias("partition"), "key", "value",
                 appended_headers(header_struct(H.DLQ_REASON, F.col("reason"))).alias("headers"))
         .write.mode("append").format("kafka").options(**self._options).save())
