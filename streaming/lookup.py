"""`delayq ledger`: where is a message? Delivered (ledger), dead-lettered (dead-letter table),
still pending (the driver's hold's spool, or the wheel's state, read with Spark's state data
source), or unknown.
And `--summary`: counts and lateness percentiles per level over a time range."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sinks.cold import TOMBSTONE
from sinks.delta import table_exists
from sinks.driver_hold import SPOOL_FOLDER as HOLD_FOLDER, held
from sinks.ledger import SPOOL_FOLDER, delivered_row
from sinks import store
from sinks.store import HadoopPath
from state.wheel import decode
from streaming.job import wheel_state


@dataclass
class Whereabouts:
    status: str            # delivered | dead | cancelled | pending | unknown
    detail: dict


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _delivered(r) -> Whereabouts:
    return Whereabouts("delivered", {
        "topic": r["topic"], "partition": r["partition"], "level": r["level"],
        "due": _iso(r["due_ms"]), "delivered": _iso(r["sent_ms"]),
        "lateness_ms": r["lateness_ms"], "batch_id": r["batch_id"],
        "intake": f"{r['intake_partition']}-{r['intake_offset']}"})


def find(spark: SparkSession, uniq_key: str, ledger: str, dead: str,
         checkpoint: str | Path | HadoopPath, cold: str | None = None,
         ready: Callable[[str], dict | None] | None = None) -> Whereabouts:
    """Where `uniq_key` is: delivered, dead-lettered, cancelled, pending (the driver's hold,
    the ready topic through `ready` with `hold = "executors"`, or the wheel's state), or
    unknown."""
    def in_table(key: str) -> dict | None:
        if not table_exists(ledger):
            return None
        rows = spark.read.format("delta").load(str(ledger)).filter(
            F.col("uniq_key") == key).collect()
        return rows[0].asDict() if rows else None

    # The driver's hold and the ledger's spool are folders beside a checkpoint on this machine.
    checkpoint = store.path(checkpoint)
    local = isinstance(checkpoint, Path)
    # Delivered moments ago, its ledger row still waits in the spool (sinks/ledger.py).
    row = delivered_row(checkpoint / SPOOL_FOLDER, uniq_key, in_table) if local \
        else in_table(uniq_key)
    if row is not None:
        return _delivered(row)
    if table_exists(dead):
        rows = spark.read.format("delta").load(str(dead)).filter(
            F.col("uniq_key") == uniq_key).collect()
        if rows:
            r = rows[0]
            return Whereabouts("dead", {"reason": r["reason"], "at": _iso(r["dead_ms"]),
                                        "intake": f"{r['intake_partition']}-{r['intake_offset']}"})
    if cold is not None and table_exists(cold):
        where = _in_cold_tier(spark, uniq_key, cold)
        if where is not None:
            return where
    # Fired ahead and waiting in the driver's hold (hold = "driver", sinks/driver_hold.py), or
    # sent by its batch's tasks and reported with the batch's last delivery.
    hit = held(checkpoint / HOLD_FOLDER, uniq_key) if local else None
    if hit is not None and hit["sent_ms"] is not None:   # sent by its batch's tasks
        return _delivered({**hit, "lateness_ms": hit["sent_ms"] - hit["due_ms"],
                           "intake_partition": hit["ipart"], "intake_offset": hit["ioff"]})
    if hit is not None:
        return Whereabouts("pending", {"topic": hit["topic"], "level": hit["level"],
                                       "due": _iso(hit["due_ms"]),
                                       "intake": f"{hit['ipart']}-{hit['ioff']}",
                                       "where": "the driver's hold"})
    hit = ready(uniq_key) if ready is not None else None
    if hit is not None:
        return Whereabouts("pending", hit)
    pending = _pending(spark, uniq_key, checkpoint)
    if pending:
        return Whereabouts("pending", pending)
    return Whereabouts("unknown", {})


def _in_cold_tier(spark: SparkSession, uniq_key: str, cold: str) -> Whereabouts | None:
    """Cancelled when a cancel's tombstone in the cold tier names it (sinks/cold.py: every
    cancel that found its message, or waits for it there), else None."""
    rows = [r.asDict() for r in spark.read.format("delta").load(str(cold))
            .filter(F.col("uniq_key") == uniq_key).collect()]
    tomb = next((r for r in rows if r.get(TOMBSTONE)), None)
    if tomb is not None:
        return Whereabouts("cancelled", {"due": _iso(tomb["due_ms"]), "cancel": _iso(tomb["append_ms"]),
                                         "intake": f"{tomb['ipart']}-{tomb['ioff']}"})
    return None


def _pending(spark: SparkSession, uniq_key: str, checkpoint: Path | HadoopPath) -> dict | None:
    if not (checkpoint / "state").is_dir():
        return None
    for row in wheel_state(spark, str(checkpoint), "chunk").toLocalIterator():
        if row["chunk"] is None:
            continue
        table = decode(row["chunk"])
        keys = table.column("uniq_key").to_pylist()
        if uniq_key in keys:
            hit = table.slice(keys.index(uniq_key), 1).to_pylist()[0]
            return {"topic": hit["topic"], "level": hit["level"], "due": _iso(hit["due_ms"]),
                    "intake": f"{hit['ipart']}-{hit['ioff']}"}
    return None


def summary(spark: SparkSession, ledger: Path, since_ms: int | None, until_ms: int | None):
    """Rows of (level, delivered, p50, p99, max lateness ms, early) over [since, until)."""
    if not table_exists(ledger):
        return []
    rows = spark.read.format("delta").load(str(ledger))
    if since_ms is not None:
        rows = rows.filter(F.col("sent_ms") >= since_ms)
    if until_ms is not None:
        rows = rows.filter(F.col("sent_ms") < until_ms)
    return (rows.groupBy("level").agg(
        F.count("*").alias("delivered"),
        F.percentile_approx("lateness_ms", 0.5).alias("p50_ms"),
        F.percentile_approx("lateness_ms", 0.99).alias("p99_ms"),
        F.max("lateness_ms").alias("max_ms"),
        F.sum(F.when(F.col("lateness_ms") < 0, 1).otherwise(0)).alias("early"),
    ).orderBy("level").collect())


def in_ready_topic(settings, uniq_key: str) -> dict | None:
    """A message fired into the ready topic that its dispatch task has not committed past: the
    rows from each ready partition's committed offset (the dispatch group's) to its end."""
    from confluent_kafka import Consumer, TopicPartition

    from sinks.dispatch import ready_row
    from state import headers as H
    from streaming.kafka_config import librdkafka_config

    consumer = Consumer({"bootstrap.servers": settings.bootstrap, **librdkafka_config(settings),
                         "group.id": f"delayq.{settings.intake_topic}.dispatch",
                         "enable.auto.commit": False})
    try:
        topic = consumer.list_topics(settings.ready_topic, timeout=30).topics.get(settings.ready_topic)
        if topic is None or topic.error is not None:
            return None
        wanted = uniq_key.encode()
        for tp in consumer.committed([TopicPartition(settings.ready_topic, p)
                                      for p in topic.partitions], timeout=30):
            low, high = consumer.get_watermark_offsets(tp, timeout=30)
            start = tp.offset if tp.offset >= 0 else low
            if start >= high:
                continue
            consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
            position = start
            while position < high:
                batch = consumer.consume(1000, timeout=5.0)
                if not batch:
                    break
                for msg in batch:
                    position = msg.offset() + 1
                    headers = msg.headers() or []
                    if (H.UNIQ_KEY, wanted) in headers:
                        row = ready_row(msg.offset(), msg.key(), msg.value(), headers)
                        return {"topic": row.topic, "level": row.level, "due": _iso(row.due_ms),
                                "intake": f"{row.ipart}-{row.ioff}",
                                "where": f"the ready topic, partition {tp.partition}"}
        return None
    finally:
        consumer.close()
