"""`delayq ledger`: where is a message? Delivered, dead-lettered, cancelled (cold tier), still
pending (ready topic, intake, or the wheel's state) or unknown; `--summary`: lateness per level."""
from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from datetime import datetime, timezone
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from sinks.store import HadoopPath
from state import headers as H
from state.columns import TOMBSTONE
from state.envelope import default_uniq_key
from streaming.dispatch.cancels import CANCELLED, MISSED, RINGED
from streaming.dispatch.rules import READY_STOP, ready_row
from streaming.kafka.config import librdkafka_config
from streaming.ledger.records import ledger_rows
from streaming.ledger.tables import Tables



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
        "topic": r["topic"], "partition": r["partition"], "offset": r.get("offset"),
        "level": r["level"], "due": _iso(r["due_ms"]), "delivered": _iso(r["sent_ms"]),
        "lateness_ms": r["lateness_ms"], "batch_id": r["batch_id"],
        "intake": f"{r['intake_partition']}-{r['intake_offset']}"})


def _cancelled(r) -> Whereabouts:
    return Whereabouts("cancelled", {"level": r["level"], "due": _iso(r["due_ms"]),
                                     "cancelled": _iso(r["sent_ms"]),
                                     "intake": f"{r['intake_partition']}-{r['intake_offset']}"})


def _dead(r) -> Whereabouts:
    return Whereabouts("dead", {"reason": r["reason"], "at": _iso(r["dead_ms"]),
                                "intake": f"{r['intake_partition']}-{r['intake_offset']}"})


def _pending_at(row, **where) -> Whereabouts:
    """A pending message from its held row or reference (attributes level, due_ms, ipart, ioff,
    and topic once its body is known)."""
    topic = getattr(row, "topic", None)
    return Whereabouts("pending", {**({"topic": topic} if topic else {}), "level": row.level,
                                   "due": _iso(row.due_ms), "intake": f"{row.ipart}-{row.ioff}",
                                   **where})


def find(tables: Tables, settings, uniq_key: str, checkpoint: Path | HadoopPath) -> Whereabouts:
    """Where `uniq_key` is, looked for in that order: the ledger and dead-letter tables, a
    cancel's tombstone in the cold tier, the Kafka topics between the wheel and the tables
    (`in_topics`), the wheel's state."""
    if rows := tables.matching(settings.ledger_path, uniq_key):
        return (_cancelled if rows[0].get("status") == CANCELLED else _delivered)(rows[0])
    if rows := tables.matching(settings.dead_letter_path, uniq_key):
        return _dead(rows[0])
    # Cancelled: a cancel leaves a tombstone in the cold tier, found its message or not.
    rows = tables.matching(settings.cold_path, uniq_key)
    if tomb := next((r for r in rows if r.get(TOMBSTONE)), None):
        return Whereabouts("cancelled", {"due": _iso(tomb["due_ms"]),
                                         "cancel": _iso(tomb["append_ms"]),
                                         "intake": f"{tomb['ipart']}-{tomb['ioff']}"})
    return (in_topics(settings, uniq_key) or _pending(tables, settings, uniq_key, checkpoint)
            or Whereabouts("unknown", {}))


def _pending(tables: Tables, settings, uniq_key: str,
             checkpoint: Path | HadoopPath) -> Whereabouts | None:
    """A message held in the wheel's state, read with Spark's state data source; the wheel holds
    references only, so its REAL_TOPIC is read from its intake record."""
    if not isinstance(checkpoint, Path):
        tables.spark   # started now: a store's checkpoint is read through Spark's Hadoop client
    if not (checkpoint / "state").is_dir():
        return None
    from pyspark.sql import functions as F

    from streaming.wheel.query import wheel_state

    held = (wheel_state(tables.spark, str(checkpoint)).where(F.array_contains("uniq_key", uniq_key))
            .select("bucket", F.explode(F.arrays_zip("uniq_key", "due_ms", "ipart", "ioff"))
                    .alias("r")).where(F.col("r.uniq_key") == uniq_key)
            .select(F.col("bucket").alias("level"), "r.due_ms", "r.ipart", "r.ioff").take(1))
    if not held:
        return None
    where = _pending_at(held[0])
    topic = intake_topic_of(settings, held[0].ipart, held[0].ioff)
    where.detail = {"topic": topic or "-", **where.detail}
    return where


def in_topics(settings, uniq_key: str) -> Whereabouts | None:
    """A message between the wheel and the tables: in the ledger topic, not yet appended (the
    last three `ledger_interval`s are read); or in the ready topic or the intake above the
    dispatch group's commits, read before the ledger: a task commits past a record in the
    transaction that writes its ledger row, so one past them has its row in the ledger read."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, **librdkafka_config(settings),
                         "group.id": f"delayq.{settings.intake_topic}.dispatch",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        commits = {topic: _commits(consumer, topic)
                   for topic in (settings.ready_topic, settings.intake_topic)}
        # A timer in a ring waits at most its horizon; this host may lead the broker.
        since_ms = (int(time.time() * 1000) - settings.clock_tolerance_ms
                    - max(3 * settings.ledger_interval_ms, settings.ring_horizon_ms))
        last = None
        for msg in _records(consumer, settings.ledger_topic, lambda tps: consumer.offsets_for_times(
                [TopicPartition(tp.topic, tp.partition, since_ms) for tp in tps], timeout=30)):
            if not msg.value() or uniq_key.encode() not in msg.value():
                continue
            rows = [r for r in ledger_rows(msg.value()).to_pylist()
                    if r["uniq_key"] == uniq_key and r["status"] != MISSED]   # a cancel's row
            last = rows[-1] if rows else last
        if last is not None:
            return _from_topic({**last, "intake_partition": last["ipart"],
                                "intake_offset": last["ioff"]})
        for msg in _records(consumer, settings.ready_topic,
                            lambda _: commits[settings.ready_topic], from_earliest=True):
            headers = msg.headers() or []
            if headers and headers[-1][0] == READY_STOP:
                continue
            row = ready_row(msg.offset(), msg.value())
            if row.uniq_key == uniq_key:   # a reference: its topic is in its intake record
                row.topic = intake_topic_of(settings, row.ipart, row.ioff) or "-"
                return _pending_at(row, where=f"the ready topic, partition {msg.partition()}")
        return _in_intake(consumer, settings, uniq_key, commits[settings.intake_topic])
    finally:
        consumer.close()


def _in_intake(consumer, settings, uniq_key: str, commits: list) -> Whereabouts | None:
    """A message a dispatch task reads from the intake itself (dispatch/direct.py: due within
    the window, or a timer for its ring) and has not finished: from the dispatch group's
    `commits` on (from the beginning where there are none yet, as a new job's task reads)."""
    if settings.dispatch_direct_max_delay_ms < 0:
        return None
    wanted = (H.UNIQ_KEY, uniq_key.encode())
    for msg in _records(consumer, settings.intake_topic,
                        lambda _: commits, from_earliest=True):
        if wanted in (msg.headers() or []) or uniq_key == default_uniq_key(msg.partition(),
                                                                           msg.offset()):
            from streaming.dispatch.direct import direct_rows   # the parse: pandas, numpy
            from streaming.stages import rules_of

            rows, *_ = direct_rows([msg], rules_of(settings, ""),
                                     settings.dispatch_direct_max_delay_ms,
                                     msg.timestamp()[1], settings.intake_topic)
            if rows and rows[0].uniq_key == uniq_key:
                return _pending_at(rows[0], where="held by the dispatch task of intake "
                                                  f"partition {rows[0].ipart}")
    return None


def _from_topic(r: dict) -> Whereabouts:
    """The last ledger row of a message in the ledger topic."""
    if r["status"] == "delivered":
        return _delivered({**r, "lateness_ms": r["sent_ms"] - r["due_ms"],
                           "batch_id": "- (in the ledger topic)"})
    if r["status"] == CANCELLED:
        return _cancelled(r)
    if r["status"] == RINGED:
        return _pending_at(SimpleNamespace(**r), where="the dispatch task's ring")
    return _dead({**r, "dead_ms": r["sent_ms"]})


def intake_topic_of(settings, ipart: int, ioff: int) -> str | None:
    """The REAL_TOPIC of the intake record at (partition, offset), None if it is gone."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, **librdkafka_config(settings),
                         "group.id": f"delayq.{settings.intake_topic}.lookup",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(settings.intake_topic, ipart, ioff)])
        for msg in consumer.consume(1, timeout=10):
            if msg.error() is None and msg.offset() == ioff:
                return dict(msg.headers() or []).get(H.REAL_TOPIC, b"").decode() or None
        return None
    finally:
        consumer.close()


def _commits(consumer, topic: str) -> list:
    """The dispatch group's commits on each partition of `topic` (offset < 0: none)."""
    found = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if found is None or found.error is not None:
        return []
    return consumer.committed([TopicPartition(topic, p) for p in found.partitions], timeout=30)


def _records(consumer, topic: str, starts, from_earliest: bool = False):
    """Every record of `topic` from the offsets `starts(partitions)` gives to each partition's
    end (given up after 30 s without progress); where it gives none, from the earliest
    (`from_earliest`) or nothing."""
    found = consumer.list_topics(topic, timeout=30).topics.get(topic)
    if found is None or found.error is not None:
        return
    for tp in starts([TopicPartition(topic, p) for p in found.partitions]):
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        start = tp.offset if tp.offset >= 0 else (low if from_earliest else high)
        if start >= high:
            continue
        consumer.assign([TopicPartition(tp.topic, tp.partition, start)])
        position, idle_until = start, time.monotonic() + 30
        while position < high and time.monotonic() < idle_until:
            before = position
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    position = msg.offset() + 1
                    yield msg
            # Past what a read_committed read skips too: a transaction's markers, which end
            # every partition a transactional producer writes (the ledger's), never come as
            # records; waiting for them took 5 s a partition.
            [now] = consumer.position([TopicPartition(tp.topic, tp.partition)])
            position = max(position, now.offset)
            if position > before:
                idle_until = time.monotonic() + 30
