"""The ledger query: the ledger topic → the Delta ledger and dead-letter tables (unless `ledger`
is off) every `ledger_interval`, and the delivery metrics. Appends are idempotent on (query id,
batch id); a message is in the ledger topic once (a restart skips what it holds), so no state.
The ledger's append and the counts run in one executor task (streaming/ledger/append.py)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property, partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery

from sinks.base import BatchSummary
from sinks.delta import append_once, query_id
from sinks.dead_letters import dead_letter_columns
from sinks.metrics import LATENESS_BUCKETS, Metrics
from streaming.dispatch.cancels import CANCELLED, MISSED
from streaming.ledger.append import (COUNTS_SCHEMA, LedgerAppend, decoded, delta_rs_uri,
                                     ledger_task)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerConfig:
    """The ledger query's settings (streaming/stages.py ledger_config_of)."""

    source: dict            # the Spark Kafka source's options (bootstrap, security)
    topic: str
    tables: bool            # False: the delivery metrics only (the `ledger` setting)
    ledger_path: str
    dead_letter_path: str
    interval_ms: int
    table_options: dict = field(default_factory=dict)   # delta-rs's for an s3a:// store


def ledger_stream(spark: SparkSession, config: LedgerConfig) -> DataFrame:
    """The ledger topic's records that hold rows (a probe is empty), read_committed: an aborted
    transaction's ledger rows are sent again by a later one."""
    raw = (spark.readStream.format("kafka").options(**config.source)
           .option("subscribe", config.topic).option("startingOffsets", "earliest")
           .option("kafka.isolation.level", "read_committed").load())
    return raw.filter(F.length("value") > 0).select("value")


def decode(batches):
    """mapInArrow: the ledger rows of the records."""
    for table in filter(None, map(decoded, batches)):
        yield from table.to_batches()


class LedgerWriter:
    """foreachBatch of the ledger query."""

    def __init__(self, config: LedgerConfig, checkpoint: str, metrics: Metrics | None):
        from streaming.ledger.records import ledger_schema

        self.config, self.checkpoint, self.metrics = config, checkpoint, metrics
        self._schema = from_arrow_schema(ledger_schema())
        # A clean stop (finish): set once it began; `idle` is clear while a batch runs.
        self.stopping = False
        self.idle = threading.Event()
        self.idle.set()

    @cached_property
    def _query_id(self) -> str:
        """Read at the first append (the query writes its metadata at its start), then kept."""
        return query_id(self.checkpoint)

    def finish(self, grace_s: float = 30.0) -> None:
        """Before the query's stop: the batch under way ends (up to `grace_s`); an interrupted
        batch runs again at the next start (its appends are idempotent)."""
        self.stopping = True
        self.idle.wait(grace_s)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.idle.clear()
        try:
            self._write(batch, batch_id)
        except Exception as e:
            if self.stopping:   # the stop's interruption: the batch runs again at the next start
                e.delayq_stop = True
            raise
        finally:
            self.idle.set()

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        tables = self.config.tables
        target = LedgerAppend(delta_rs_uri(self.config.ledger_path) if tables else None,
                              self.config.table_options, self._query_id if tables else "",
                              batch_id, int(time.time() * 1000))
        # One task: one commit, and the counts of the rows it appended.
        counts = [row.asDict() for row in batch.coalesce(1).mapInArrow(
            partial(ledger_task, target), from_arrow_schema(COUNTS_SCHEMA)).collect()]
        summary = self._summary(batch_id, counts)
        if summary.count("dead") and tables:
            # Rows the dispatch could not deliver (the real topic refused them), as they came,
            # to the dead-letter table beside those the wheel rejected (by Spark, as the wheel).
            dead = batch.mapInArrow(decode, self._schema).filter(
                F.col("status") == "dead").select(*dead_letter_columns(batch_id))
            append_once(dead, self.config.dead_letter_path, self._query_id,
                        batch_id, ("dead_date",))
        if self.metrics is not None:
            self.metrics.observe_batch(summary)

    @staticmethod
    def _summary(batch_id: int, counted: list[dict]) -> BatchSummary:
        summary = BatchSummary(batch_id)
        delivered = [row for row in counted if row["status"] == "delivered"]
        for row in delivered:
            summary.add("deliver", row["level"], None, row["count_all"])
        outcomes = {"dead": "dead", CANCELLED: "cancelled", MISSED: "cancel_unknown"}
        for row in counted:
            if row["status"] in outcomes:
                summary.add(outcomes[row["status"]], None, row["reason"], row["count_all"])
            if row["direct"] and row["status"] != MISSED:   # a miss's row is its cancel's
                summary.add("tally", row["level"], None, 1, row["count_all"])
        if delivered:
            buckets = [sum(row[f"le{i}_sum"] for row in delivered)
                       for i in range(len(LATENESS_BUCKETS))]
            summary.lateness = (buckets, sum(row["count_all"] for row in delivered),
                                sum(row["lateness_sum"] for row in delivered) / 1000)
        return summary


def start_ledger_query(spark: SparkSession, config: LedgerConfig, checkpoint: str,
                       metrics: Metrics | None, name: str) -> tuple[StreamingQuery, LedgerWriter]:
    location = checkpoint.rstrip("/") + "-ledger"   # the ledger query's, beside the wheel's
    writer = LedgerWriter(config, location, metrics)
    return (ledger_stream(spark, config).writeStream.queryName(name).foreachBatch(writer)
            .option("checkpointLocation", location)
            .trigger(processingTime=f"{config.interval_ms} milliseconds")
            .start()), writer
