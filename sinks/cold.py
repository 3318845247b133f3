"""The cold tier: messages due beyond the near horizon (timers: beyond the ring's, when its rolls
feed the rings) wait in a Delta table by due bucket, not in Spark state (the wheel's timeout scan
stays small), until rolled back onto the intake. Never lost: a bucket is marked loaded only after
its roll; a message for a loaded bucket is rolled at once. Never twice: a roll cut short is done
again without what it wrote already."""
from __future__ import annotations

import json
import time
from functools import cached_property
from pathlib import Path

from typing import Callable

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from sinks import store
from sinks.base import BatchSummary
from sinks.delta import append_once, query_id, table_exists
from sinks.kafka import appended_headers, header_struct
from state import headers as H
from state.columns import TOMBSTONE, WITH_BODY
from state.envelope import TIMER_LEVEL
from state.errors import JobError
from state.seal import LENGTH
from state.timing import bucket_start

COLUMNS = ("uniq_key", "topic", "partition", "key", "value", "headers", "level", "due_ms",
           "append_ms", "ipart", "ioff")
# TOMBSTONE: null on a message; a cancel's is WAITING (meets its message at the roll) or DONE.
WAITING, DONE = "waiting", "done"
# What a tombstone keeps of its cancel's row.
_TOMBSTONE_KEEPS = ("uniq_key", "level", "due_ms", "append_ms", "ipart", "ioff")


class ColdTier:
    def __init__(self, spark: SparkSession, path: Path, checkpoint: str, intake_topic: str,
                 kafka_options: dict[str, str], bucket_ms: int, horizon_ms: int, seal_key: str,
                 intake_ends: Callable[[], dict[int, int]], clock=time.time):
        """`horizon_ms`: a bucket rolls this long before it starts (conf/settings.py
        roll_lead_ms); `intake_ends`: partition → the intake's end offset now."""
        self.spark, self.path, self.checkpoint = spark, str(path), checkpoint
        self.intake, self._intake_ends = intake_topic, intake_ends
        self.options, self.bucket_ms, self.horizon_ms = kafka_options, bucket_ms, horizon_ms
        self.clock, self._seal_key = clock, seal_key
        self.marker = store.path(checkpoint) / "cold" / "loaded_until"
        self._loaded: int | None = None   # the marker as last read or written here
        # A roll the marker says began and did not end: {"until": bucket, "from": the intake's
        # end offsets before it wrote anything}.
        self._rolling: dict | None = None

    # The marker: every bucket up to and including it is in the wheel.
    def loaded_until(self) -> int:
        if self._loaded is not None:
            return self._loaded
        try:
            marker = json.loads(self.marker.read_text())
            self._loaded, self._rolling = int(marker["loaded_until"]), marker.get("rolling")
        except FileNotFoundError:
            if table_exists(self.path):   # made again at the horizon, it would skip buckets
                raise JobError(
                    f"the cold tier's marker {self.marker} is missing, and {self.path} holds "
                    f"parked messages: started from now, the buckets not rolled yet would never "
                    f"roll. Put the marker back (from a copy of the checkpoint), or write it as "
                    f'{{"loaded_until": <ms>}}: the start of the last bucket the job rolled '
                    f"(an earlier one rolls buckets again: their messages are sent twice)") \
                    from None
            self._set_loaded(self._horizon_bucket())
        return self._loaded

    def _horizon_bucket(self) -> int:
        return bucket_start(int(self.clock() * 1000) + self.horizon_ms, self.bucket_ms)

    def _set_loaded(self, bucket: int, rolling: dict | None = None) -> None:
        marker = {"loaded_until": bucket, **({"rolling": rolling} if rolling else {})}
        store.write_atomic(self.marker, json.dumps(marker))
        self._loaded, self._rolling = bucket, rolling

    def park(self, batch: DataFrame, bodied: DataFrame | None, summary: BatchSummary) -> None:
        """The batch's cold rows, records read back (`bodied`, WITH_BODY), to the table (rolled at
        once if their bucket is loaded), and a tombstone per cancel: WAITING for a miss whose
        bucket is not loaded (no miss yet: recounted as `cancel_parked`), DONE for a hit."""
        misses, hits = summary.count("cancel_unknown"), summary.count("cancelled")
        if not summary.count("cold") and not misses and not hits:
            return
        loaded = self.loaded_until()
        bucket = F.col("due_ms") - F.pmod("due_ms", F.lit(self.bucket_ms))   # timing.bucket_start
        frames = []
        if summary.count("cold"):
            # The message's own headers: the contract's are written again by the roll.
            own = F.filter("headers", lambda h: ~h["key"].isin(*sorted(H.CONTROL_HEADERS)))
            rows = (bodied.filter(F.col("kind") == "cold").withColumn("headers", own)
                    .select(*COLUMNS)
                    .withColumn(TOMBSTONE, F.lit(None).cast("string"))
                    .withColumn("due_bucket", bucket))
            if summary.count("cold_now"):   # counted by the ready write (sinks/ready.py)
                self._roll_now(rows.filter(F.col("due_bucket") <= loaded), summary)
            frames.append(rows.filter(F.col("due_bucket") > loaded))
        if misses or hits:
            types = {f.name: f.dataType for f in from_arrow_schema(WITH_BODY).fields}
            kind = F.col("kind")
            waiting = (kind == "cancel_unknown") & (bucket > loaded)
            tombs = (batch.filter((kind == "cancelled") | waiting)
                     .select(*[F.col(c) if c in _TOMBSTONE_KEEPS
                               else F.lit(None).cast(types[c]).alias(c) for c in COLUMNS],
                             F.when(kind == "cancelled", F.lit(DONE)).otherwise(F.lit(WAITING))
                             .alias(TOMBSTONE))
                     .withColumn("due_bucket", bucket))
            frames.append(tombs)
            if misses:
                summary.recount("cancel_unknown", "cancel_parked", batch.filter(waiting).count())
        rows = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        # One append for the batch: a second one with the same txnVersion would be skipped.
        append_once(rows, self.path, self._query_id, summary.batch_id, ("due_bucket",),
                    merge_schema=True)

    @cached_property
    def _query_id(self) -> str:
        """Read at the first append (the query writes its metadata at its start), then kept."""
        return query_id(self.checkpoint)

    def advance(self, summary: BatchSummary) -> int:
        """Roll every bucket now within the horizon in one table read and one intake write;
        returns how many buckets. Messages a tombstone names stay behind, counted cancelled; a
        tombstone whose message never came counts as a miss. The marker says when a roll begins
        and where the intake ended then: a roll cut short (a crash, a failed batch) is done again
        without the records it wrote (`_not_rolled`)."""
        loaded, edge, rolling = self.loaded_until(), self._horizon_bucket(), self._rolling
        edge = max(edge, rolling["until"]) if rolling else edge
        if loaded + self.bucket_ms > edge:
            if rolling:   # a roll of this batch's rows (`_roll_now`) ended
                self._set_loaded(loaded)
            return 0
        if table_exists(self.path):
            if rolling is None:
                self._set_loaded(loaded, {"until": edge, "from": self._intake_ends()})
            self._roll_buckets(loaded, edge, summary, rolling and rolling["from"])
        self._set_loaded(edge)
        return (edge - loaded) // self.bucket_ms

    def _roll_buckets(self, after: int, until: int, summary: BatchSummary,
                      since: dict | None) -> None:
        bucket = F.col("due_bucket")
        rows = (self.spark.read.format("delta").load(self.path)
                .filter((bucket > after) & (bucket <= until)))
        if since:
            rows = self._not_rolled(rows, since)
        if TOMBSTONE not in rows.columns:   # a table no cancel was parked in yet
            self.roll(rows, summary)
            return
        # A tombstone names its message by key in its own bucket (its cancel's due time).
        named = ["uniq_key", "due_bucket"]
        messages = rows.filter(F.col(TOMBSTONE).isNull())
        waiting = rows.filter(F.col(TOMBSTONE) == WAITING).select(*named).distinct()
        self.roll(messages.join(waiting, named, "left_anti"), summary)
        for row in messages.join(waiting, named, "left_semi").groupBy("level").count().collect():
            summary.add("cancelled", row["level"], None, row["count"])
            summary.pending_delta_by_level[row["level"]] -= row["count"]
        summary.add("cancel_unknown", None, None,
                    waiting.join(messages, named, "left_anti").count())

    def _roll_now(self, rows: DataFrame, summary: BatchSummary) -> None:
        """Roll a batch's cold rows whose bucket rolled already, once: marked as a roll begun
        (`advance` ends it), so the batch run again after a crash leaves out what it wrote."""
        loaded, rolling = self.loaded_until(), self._rolling
        if rolling is None:
            self._set_loaded(loaded, {"until": loaded, "from": self._intake_ends()})
        since = rolling and rolling["from"]
        self.roll(self._not_rolled(rows, since) if since else rows, summary)

    def _not_rolled(self, rows: DataFrame, since: dict) -> DataFrame:
        """`rows` but those a roll cut short wrote onto the intake from `since` (partition → its
        end before that roll) on: the same UNIQ_KEY, due time and sealed mark, which no producer
        can forge (state/seal.py)."""
        def header(name: str) -> F.Column:   # null where none (ANSI: `[0]` fails the batch)
            return F.get(F.filter("headers", lambda h: h["key"] == name), 0)["value"].cast(
                "string")
        found = (self.spark.read.format("kafka").options(**self.options)
                 .option("assign", json.dumps({self.intake: [int(p) for p in since]}))
                 .option("startingOffsets", json.dumps({self.intake: since}))
                 .option("endingOffsets", "latest").option("includeHeaders", "true")
                 .option("failOnDataLoss", "false").load()
                 .select(header(H.UNIQ_KEY).alias("uniq_key"),
                         header(H.TIMER_DELIVER_MS).cast("long").alias("due_ms"),
                         header(H.ROLLED).alias("mark"))
                 .filter(F.col("mark").isNotNull()).distinct())
        return (rows.withColumn("mark", self._mark())
                .join(found, ["uniq_key", "due_ms", "mark"], "left_anti").drop("mark"))

    def roll(self, rows: DataFrame, summary: BatchSummary) -> None:
        """Put cold messages back on the intake, each on the partition it came in on (where its
        producer writes its cancel too), marked and sealed as the cold tier's (state/seal.py), in
        due order within each partition: the wheel fires them in that order, and their dispatch
        task reads their bodies back forward (streaming/dispatch/bodies.py). Timers leave the
        wheel's pending count here: a dispatch task's ring counts those it takes (the wheel
        counts those it holds again, state/wheel.py `turn`)."""
        headers = appended_headers(
            header_struct(H.REAL_TOPIC, F.col("topic")),
            header_struct(H.REAL_QID, F.col("partition").cast("string")),
            header_struct(H.UNIQ_KEY, F.col("uniq_key")),
            header_struct(H.TIMER_DELIVER_MS, F.col("due_ms").cast("string")),
            header_struct(H.ROLLED, self._mark()))
        seen = Observation()
        (rows.observe(seen, F.count_if(F.col("level") == TIMER_LEVEL).alias("timers"))
         .repartition("ipart").sortWithinPartitions("due_ms", "ipart", "ioff")
         .select(F.lit(self.intake).alias("topic"), F.col("ipart").alias("partition"),
                 "key", "value", headers.alias("headers"))
         .write.mode("append").format("kafka").options(**self.options).save())
        # No task ran (buckets without files): Spark's row of metrics is empty, which PySpark's
        # Observation.get cannot convert.
        if seen._jo.getRow().length() and (timers := seen.get["timers"]):
            summary.pending_delta_by_level[TIMER_LEVEL] -= timers

    def _mark(self) -> F.Column:
        """A rolled record's ROLLED value: its level and seal."""
        return F.concat(F.col("level").cast("string"), F.lit(":"), self._sealed())

    def _sealed(self) -> F.Column:
        """state/seal.py `seal` of `rolled_text`, in Spark SQL."""
        def sha(*parts) -> F.Column:
            return F.sha2(F.concat(F.lit(f"{self._seal_key}:"), *parts), 256)
        text = [F.col("level").cast("string"), F.col("due_ms").cast("string"), F.col("topic"),
                F.coalesce(F.col("partition").cast("string"), F.lit("")), F.col("uniq_key")]
        return F.substring(sha(sha(F.concat_ws(":", *text))), 1, LENGTH)
