"""A dispatch task's read-back of message bodies from the intake (DESIGN.md section 4): the wheel
fires references and the task reads each record, in offset order per intake partition. The record
must be the one referenced (UNIQ_KEY, append time: a recreated topic or unclean leader election
reuses offsets), else it is dead-lettered; the due time is the reference's. No Spark import."""
from __future__ import annotations

import heapq
import logging
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streaming.dispatch.direct import intake_batch
from streaming.dispatch.rules import Row
from state import headers as H
from state.envelope import Kind, Rules
from state.parse import parse_batch
from state.reasons import reason

log = logging.getLogger(__name__)

# How long a pass of `pump` reads at most, so the task's loop keeps sending what is due.
PUMP_S = 0.02
# How long a partition's end may stay before a reference before it is taken to name no record
# (a truncated log); a new leader's end can trail for a moment.
END_WAIT_S = 10.0
_NO_PARTITION = (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                 KafkaError._UNKNOWN_TOPIC)


def gone(row: Row, why: str) -> str:
    return reason("intake_record_gone", f"intake record {row.ipart}-{row.ioff} of "
                                        f"{row.uniq_key} {why}")


class Bodies:
    """The references a task waits for the bodies of, by intake partition, and the consumer
    that reads them (never committed: the task's ready partition's commit covers them)."""

    def __init__(self, consumer_config: dict, topic: str, rules: Rules, fetch_gap: int,
                 read_batch: int):
        self.topic, self.rules, self.gap, self.read_batch = topic, rules, fetch_gap, read_batch
        self.consumer = Consumer({
            **consumer_config, "enable.auto.commit": False, "auto.offset.reset": "error",
            "enable.partition.eof": True, "isolation.level": "read_committed",
            # A reposition drops what was fetched ahead: fetch ahead a little, not megabytes.
            "max.partition.fetch.bytes": 262_144, "queued.max.messages.kbytes": 8_192,
            # ... and fetch again at once: the default waits a second once that much is queued
            # (bench_readback.py, with its commit's other changes: 18.9 s → 5.9 s for 200,000).
            "fetch.queue.backoff.ms": 5})
        self.wants: dict[int, dict[int, list[Row]]] = {}   # ipart → offset → rows
        self._offsets: dict[int, list[int]] = {}   # ipart → a heap of its wanted offsets
        self.reading: dict[int, int] = {}   # assigned partitions → the offset read next
        self._back: dict[int, int] = {}   # read partitions with a new reference behind them
        self._ended: dict[int, float] = {}   # partitions at their end with references beyond
        self._count = 0   # the intake's partitions, as its metadata last said
        self._order: dict[int, list[tuple]] = {}   # ipart → a heap of its wants' (due, ipart,
        # ioff), lazily pruned
        self.restored: list[Row] = []
        self.dead: list[tuple[Row, str]] = []

    def want(self, row: Row) -> None:
        p, offset = row.ipart, row.ioff
        rows = self.wants.setdefault(p, {}).setdefault(offset, [])
        if not rows:
            heapq.heappush(self._offsets.setdefault(p, []), offset)
        rows.append(row)
        heapq.heappush(self._order.setdefault(p, []), (row.due_ms, p, offset))
        if p in self.reading and offset < self.reading[p]:
            self._back[p] = min(offset, self._back.get(p, offset))

    def first_wanted(self, p: int | None = None) -> tuple | None:
        """The heap order (due, ipart, ioff) of the earliest reference without its body, in
        intake partition `p` (None: in any): no row of that partition due after it is sent
        before it (one key's order)."""
        if p is None:
            return min(filter(None, map(self.first_wanted, list(self._order))), default=None)
        order, wants = self._order.get(p), self.wants.get(p, ())
        while order and order[0][2] not in wants:
            heapq.heappop(order)
        if not order:
            self._order.pop(p, None)
            return None
        return order[0]

    def pending(self) -> int:
        return sum(len(offsets) for offsets in self.wants.values())

    def pump(self, wait_s: float = 0.0) -> bool:
        """Read the wanted records fetched, for up to PUMP_S after waiting up to `wait_s` for the
        first (`take` gives the results). Whether there was anything to read."""
        self._position()
        now = time.monotonic()
        for p in [p for p, since in self._ended.items() if now - since >= END_WAIT_S]:
            del self._ended[p]   # its end stayed before a reference: the log was cut short
            self._out_of_range(p, drop=False)
        reading = bool(self.reading)
        found = []
        deadline = time.monotonic() + PUMP_S
        while self.reading and time.monotonic() < deadline:
            msgs = self.consumer.consume(self.read_batch, timeout=wait_s)
            wait_s = 0
            if not msgs:
                break
            for msg in msgs:
                err = msg.error()
                if err is None:
                    found.extend(self._read(msg.partition(), msg.offset(), msg))
                elif err.code() == KafkaError._PARTITION_EOF:
                    self._at_end(msg.partition(), msg.offset())
                elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    self._out_of_range(msg.partition())
                elif err.code() in _NO_PARTITION:
                    self._passed(msg.partition(), 2**63 - 1, "is in no partition (the intake "
                                                             "was recreated with fewer)")
                    self._drop(msg.partition())
                elif err.fatal():
                    raise RuntimeError(f"intake read-back: {err}")
                else:
                    log.warning("intake read-back: %s", err)
            self._position()
        if found:
            self._restore(found)
        return reading

    def _next(self, p: int) -> int | None:
        """Partition `p`'s lowest wanted offset."""
        heap, offsets = self._offsets.get(p, []), self.wants.get(p, {})
        while heap and heap[0] not in offsets:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _position(self) -> None:
        """Assign unread partitions with references at their first; seek back to references
        behind the position; drop partitions with none left."""
        for p, offset in self._back.items():
            if p in self.reading:
                self._seek(p, offset)
        self._back.clear()
        drop = [p for p in self.reading if self._next(p) is None]
        if drop:
            self.consumer.incremental_unassign([TopicPartition(self.topic, p) for p in drop])
            for p in drop:
                del self.reading[p]
        add = []
        for p in self.wants:
            first = self._next(p) if p not in self.reading else None
            if first is not None and not self._exists(p):
                self._passed(p, 2**63 - 1, "is in no partition (the intake was recreated with "
                                           "fewer)")
            elif first is not None:
                self.reading[p] = first
                add.append(TopicPartition(self.topic, p, first))
        if add:
            self.consumer.incremental_assign(add)

    def _exists(self, p: int) -> bool:
        """Whether the intake has partition `p` (librdkafka waits for an assigned partition it
        does not know, and says nothing); an answer that names no partitions is no answer."""
        if p >= self._count:
            topic = self.consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                return True
            self._count = len(topic.partitions)
        return p < self._count

    def _seek(self, p: int, offset: int) -> None:
        """Read partition `p` from `offset` (librdkafka drops what it fetched from before)."""
        self.consumer.incremental_unassign([TopicPartition(self.topic, p)])
        self.consumer.incremental_assign([TopicPartition(self.topic, p, offset)])
        self.reading[p] = offset

    def _read(self, p: int, offset: int, msg) -> list:
        """A record read: references it passed had none (read_committed skips aborted writes);
        then on to the next wanted, seeking past a gap of more than `fetch_gap` records."""
        if p not in self.reading or offset < self.reading[p]:
            return []
        self._passed(p, offset, "was not read (aborted, or removed)")
        rows = self.wants.get(p, {}).pop(offset, None)
        self.reading[p] = offset + 1
        self._ended.pop(p, None)
        following = self._next(p)
        if following is not None and following - offset > self.gap:
            self._seek(p, following)
        return [(msg, row) for row in rows] if rows else []

    def _passed(self, p: int, offset: int, why: str) -> None:
        """Dead-letter the references of partition `p` below `offset`."""
        offsets = self.wants.get(p, {})
        while (low := self._next(p)) is not None and low < offset:
            self.dead.extend((row, gone(row, why)) for row in offsets.pop(low))

    def _at_end(self, p: int, offset: int) -> None:
        """The end reached at `offset`: references below it were skipped (aborted writes); those
        past it wait (the wheel read their records), unless the end stays before them END_WAIT_S
        (`pump`: the client says it is at the end once, not again while nothing comes)."""
        if p not in self.reading:
            return
        self._passed(p, offset, "was not read (aborted, or removed)")
        if self._next(p) is not None:
            self._ended.setdefault(p, time.monotonic())

    def _out_of_range(self, p: int, drop: bool = True) -> None:
        """A position outside the partition, or its end long before a reference: references
        below its first record (retention) or from its end on (a truncated log) have none."""
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30,
                                                        cached=False)
        offsets = self.wants.get(p, {})
        while (first := self._next(p)) is not None and first < low:
            self.dead.extend((row, gone(row, "was deleted (the intake's retention)"))
                             for row in offsets.pop(first))
        for beyond in [o for o in offsets if o >= high]:
            self.dead.extend((row, gone(row, "is beyond the partition's end"))
                             for row in offsets.pop(beyond))
        if drop:
            self._drop(p)

    def _drop(self, p: int) -> None:
        """Stop reading `p`; `_position` assigns it again at its next reference, if any."""
        if self.reading.pop(p, None) is not None:
            self.consumer.incremental_unassign([TopicPartition(self.topic, p)])

    def _restore(self, found: list) -> None:
        """The records read, parsed at once, checked against their references and restored as
        the wheel delivers them (own headers, then UNIQ_KEY and the reference's DELIVER_MS)."""
        msgs = [msg for msg, _ in found]
        parsed = parse_batch(intake_batch(msgs), self.rules, slot_ms=1000, spread=1,
                             now_ms=int(time.time() * 1000))
        columns = zip(*(parsed.column(name).to_pylist() for name in (
            "uniq_key", "kind", "topic", "qid", "hkeys", "hvals", "reason")))
        dead_kind = Kind.DEAD.value
        for (msg, row), (uniq, kind, topic, qid, hkeys, hvals, why) in zip(found, columns):
            if uniq != row.uniq_key or msg.timestamp()[1] != row.append_ms:
                self.dead.append((row, reason(
                    "intake_record_replaced",
                    f"intake record {row.ipart}-{row.ioff} is not {row.uniq_key} appended at "
                    f"{row.append_ms} (the intake was recreated or lost records)")))
                continue
            row.key, row.value, row.body = msg.key(), msg.value(), True
            own = list(zip(hkeys, hvals)) if hkeys else []
            if kind == dead_kind:   # as it came: all its headers
                row.headers = own
                self.dead.append((row, why))
                continue
            row.topic, row.partition = topic, qid
            own += ((H.UNIQ_KEY, row.uniq_key.encode()), (H.DELIVER_MS, str(row.due_ms).encode()))
            row.headers = own
            self.restored.append(row)

    def take(self) -> tuple[list[Row], list[tuple[Row, str]]]:
        """The rows restored and the references dead-lettered since the last call."""
        restored, dead, self.restored, self.dead = self.restored, self.dead, [], []
        return restored, dead

    def close(self) -> None:
        self.consumer.close()
