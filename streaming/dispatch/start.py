"""Where a dispatch task starts: its partitions, their committed offsets and metadata, and the
messages its ledger partition holds, which a restart skips. `retrying` waits for a cluster."""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streaming.dispatch.cancels import CANCELLED, MISSED, RINGED
from streaming.dispatch.rules import DispatchConfig
from streaming.ledger.records import ledger_rows
from state.errors import DispatchError

log = logging.getLogger(__name__)


# What the ledger says of a (UNIQ_KEY, due), as bits (`in_ledger`): the message is done (sent,
# dead-lettered or dropped), which a restart skips; a cancel of it is settled, heard no more; it
# was written to the ring (ring.py), which a restart reading its intake record skips.
TARGET_DONE, CANCEL_SETTLED, IN_RING = 1, 2, 4
_BITS = {"delivered": TARGET_DONE, "dead": TARGET_DONE, CANCELLED: TARGET_DONE | CANCEL_SETTLED,
         MISSED: CANCEL_SETTLED, RINGED: IN_RING}


class Aborted(Exception):
    """The task's open transaction cannot commit: it starts again from its last commit."""


class Stalled(Exception):
    """The task's producer is cut off from the broker: it starts again from its last commit
    with a new producer, which fences it (its transaction cannot be aborted)."""


def retrying(call: Callable[[], object], timeout_s: float = 120.0, pause_s: float = 1.0):
    """`call()`, again after a pause while it raises a transient Kafka error (a coordinator
    still loading, a broker restarting) and `timeout_s` has not passed; a transaction's
    abortable failure raises `Aborted`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if isinstance(err, KafkaError) and err.txn_requires_abort():
                raise Aborted(str(err)) from e
            if not transient(e) or time.monotonic() > deadline:
                raise
            log.info("dispatch: %s; retrying", e)
            time.sleep(pause_s)


def transient(e: KafkaException) -> bool:
    """A Kafka failure that passes by itself (retriable, or a cluster still starting)."""
    err = e.args[0] if e.args else None
    return hasattr(err, "code") and (err.retriable() or err.code() in {
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._WAIT_COORD, KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT})


def owned_partitions(consumer, config: DispatchConfig, task: int) -> list:
    """The intake partitions task `task` reads itself (none when no level is direct)."""
    if config.direct_max_delay_ms < 0:
        return []
    topic = consumer.list_topics(config.intake_topic, timeout=60).topics[config.intake_topic]
    if topic.error is not None:
        raise KafkaException(topic.error)
    return [TopicPartition(config.intake_topic, q) for q in range(len(topic.partitions))
            if q % config.ready_partitions == task]


def committed(consumer, config: DispatchConfig, parts: list) -> tuple[dict, int | None, list]:
    """Where each of `parts` starts by Row.source (committed, else `intake_start` or the
    beginning); the earliest ledger mark of their commits (None: none); and the newest wheel
    batch the ready commit names with its first offset there (rules.py Refired), or []."""
    starts, marks, batch = {}, [], []
    for tp in consumer.committed(parts, timeout=60):
        source = None if tp.topic == config.ready_topic else (tp.topic, tp.partition)
        if tp.offset >= 0:
            starts[source] = tp.offset
            meta = json.loads(tp.metadata) if tp.metadata else {}
            if meta.get("ledger") is not None:
                marks.append(meta["ledger"])
            if source is None:
                batch = meta.get("batch") or []
            continue
        low, _ = consumer.get_watermark_offsets(tp, timeout=60)
        starts[source] = max(low, config.intake_start.get(tp.partition, low)) \
            if tp.topic == config.intake_topic else low
    return starts, min(marks) if marks else None, batch


def in_ledger(consumer, ends, ledger, mark: int | None, intake_topic: str,
              ring_topic: str | None, deadline_s: float
              ) -> tuple[dict[tuple[str, int], int], dict, int]:
    """From the ledger mark (or the beginning) to the end of `ledger`, read by `consumer`
    (read_committed): what it says of each (UNIQ_KEY, due) as TARGET_DONE and CANCEL_SETTLED
    bits, which a restart skips; each source's last row there, which the commits' marks wait for
    (rules.py Offsets); and the partition's end, its high watermark as `ends` (read_uncommitted)
    sees it: a read_committed end stops at a transaction left open, before the rows committed
    after it. All of it or nothing: a transient error, or a transaction still open, is waited
    out up to `deadline_s`, then, like any other error, it raises."""
    deadline = time.monotonic() + deadline_s
    low, high = retrying(lambda: ends.get_watermark_offsets(
        ledger, timeout=max(1.0, deadline - time.monotonic())), timeout_s=deadline_s)
    position = low if mark is None else max(low, min(mark, high))
    done: dict[tuple[str, int], int] = {}
    last: dict = {}
    if position >= high:
        return done, last, high
    consumer.assign([TopicPartition(ledger.topic, ledger.partition, position)])
    try:
        while position < high:   # all of it: a skip that misses a row sends its message twice
            if time.monotonic() > deadline:
                raise DispatchError(   # not sending what the unread part may say was sent
                    f"the restart's skip read ledger partition {ledger.partition} only to offset "
                    f"{position} of {high} in {deadline_s:.0f} s (dispatch_skip_deadline): the "
                    f"broker away, or a transaction left open there")
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error():
                    _unless_transient(msg.error(), ledger.partition)
                    continue
                position = msg.offset() + 1
                if msg.value():   # else a probe
                    _learn(ledger_rows(msg.value()), done, last, intake_topic, ring_topic)
            # Past what read_committed skips, too (an aborted transaction's records and markers).
            [now] = consumer.position([TopicPartition(ledger.topic, ledger.partition)])
            position = max(position, now.offset)
    finally:
        consumer.unassign()
    return done, last, high


def _unless_transient(err: KafkaError, partition: int) -> None:
    """A consumer's error report while reading the ledger: logged if the client goes on by
    itself (a broker away, a leader moving), else raised."""
    if err.code() == KafkaError._PARTITION_EOF:
        return
    if err.fatal() or not transient(KafkaException(err)):
        raise KafkaException(err)
    log.warning("reading ledger partition %d for the restart's skip: %s; waiting", partition, err)


def _learn(rows, done: dict, last: dict, intake_topic: str, ring_topic: str | None) -> None:
    """What a ledger record's rows say: each (UNIQ_KEY, due)'s bits, each source's last row."""
    columns = (rows.column(name).to_pylist() for name in (
        "uniq_key", "due_ms", "ready_offset", "ipart", "ioff", "status", "ring_partition",
        "ring_offset"))
    for key, due, ready, ipart, ioff, status, ring, ring_offset in zip(*columns):
        # A resend, due at another time, is sent.
        done[(key, due)] = done.get((key, due), 0) | _BITS.get(status, TARGET_DONE)
        source, offset = ((None, ready) if ready is not None else
                          ((ring_topic, ring), ring_offset) if ring is not None else
                          ((intake_topic, ipart), ioff))
        last[source] = max(last.get(source, -1), offset)
