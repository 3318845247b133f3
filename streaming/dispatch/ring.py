"""A dispatch task's own timer wheel (DESIGN.md section 4, the ring): a timer due beyond the direct
window and within the ring's horizon is written once, in the task's transaction with its ledger
row `ringed`, to the partition of its due slot in <intake>.TIMERS (task p owns partitions p*N to
p*N+N-1; slot t // w lives in partition p*N + (t // w) mod N), and each slot's partition is read
once, forward, `lead_ms` before the slot starts. One writer and one reader per partition keep
each intake partition's messages in due order and make the ring exactly once. Kafka serves a
partition forward at its full speed where a record at an offset costs a round trip: this is
RocketMQ 5's TimerWheel over its TimerLog, with Kafka partitions as the slots. No Spark import."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streaming.dispatch.rules import Row

log = logging.getLogger(__name__)

# A ring record's header: what its row needs besides its message and delivered headers.
RING = "DELAYQ_RING"


@dataclass(frozen=True)
class RingConfig:
    topic: str
    slots: int       # N, per task (0: no ring)
    slot_ms: int     # w
    lead_ms: int     # a slot is read this long before it starts


def ring_value(row: Row) -> bytes:
    """The RING header of `row`: due, level, append time, intake partition and offset, topic and
    partition (empty: the partitioner's)."""
    qid = "" if row.partition is None else row.partition
    return (f"{row.due_ms},{row.level},{row.append_ms},{row.ipart},{row.ioff},{row.topic},{qid}"
            .encode())


def ring_row(msg) -> Row:
    """A ring record as the row it was written from, its source now the ring partition."""
    headers = msg.headers() or []
    due, level, append, ipart, ioff, topic, qid = headers[-1][1].decode().split(",")
    delivered = headers[:-1]   # the message's own headers, then UNIQ_KEY and DELIVER_MS
    return Row(int(due), int(ipart), int(ioff), msg.offset(), topic, int(qid) if qid else None,
               msg.key(), msg.value(), delivered, int(level), int(append),
               delivered[-2][1].decode(), source=(msg.topic(), msg.partition()))


class Ring:
    """The ring of task `task`: where a timer is written, which slot is read next, and the reads
    (a consumer of its own, never committed: the task's commits cover the ring's sources)."""

    def __init__(self, consumer_config: dict, config: RingConfig, task: int):
        self.config, self.task = config, task
        self.ends: dict[int, int] = {}   # partition → its end as the task last knew it
        self.consumer = Consumer({
            **consumer_config, "enable.auto.commit": False, "auto.offset.reset": "error",
            "enable.partition.eof": True, "isolation.level": "read_committed",
            # a slot is read at once to its end: no waiting there for records to come
            "fetch.wait.max.ms": 10})
        self.next_slot: int | None = None   # the first slot not yet read (`open`)
        self.reading: tuple[int, int] | None = None   # (slot, partition) being read
        self.dirty: set[int] = set()   # partitions written in the open transaction

    def partitions(self) -> list[int]:
        n = self.config.slots
        return list(range(self.task * n, (self.task + 1) * n))

    def partition(self, slot: int) -> int:
        return self.task * self.config.slots + slot % self.config.slots

    def slot(self, due_ms: int) -> int:
        return due_ms // self.config.slot_ms

    def start(self, now_ms: int) -> None:
        """A turn back from now: every partition is read once more, oldest slot first, so what
        a stopped task left there leaves in due order (overdue rows at once)."""
        self.next_slot = self.slot(now_ms) - self.config.slots + 1

    def takes(self, row: Row, now_ms: int) -> bool:
        """Whether `row` (a timer in the ring's band) goes to the ring: its slot is not read yet
        and it is not due within the read lead; else the task holds it."""
        return (self.slot(row.due_ms) > self.next_slot
                and row.due_ms > now_ms + self.config.lead_ms)

    def due_to_open(self, now_ms: int) -> int | None:
        """The next slot to read, if its time has come and no slot is being read."""
        slot = self.next_slot
        if self.reading is None and slot * self.config.slot_ms - self.config.lead_ms <= now_ms:
            return slot
        return None

    def lag_ms(self, now_ms: int) -> int:
        """How long past its time the next slot waits to be read (0: on time)."""
        return max(0, now_ms - (self.next_slot * self.config.slot_ms - self.config.lead_ms))

    def open(self, slot: int, position: int) -> None:
        """Read `slot`'s partition forward from `position` (none past its end: the task is its
        only writer, and knows it)."""
        part = self.partition(slot)
        if position >= self.ends.get(part, 0):
            self.next_slot = slot + 1
            return
        self.reading = slot, part
        self.consumer.assign([TopicPartition(self.config.topic, part, position)])

    def pump(self, wait_s: float = 0.0) -> list[Row]:
        """The open slot's rows read now: those of its turn or an earlier one; at the first row
        of a later turn, or the partition's end, the slot is read and the next one may open."""
        if self.reading is None:
            return []
        slot, part = self.reading
        rows = []
        for msg in self.consumer.consume(5000, timeout=wait_s):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return self._read(rows)
                if err.fatal():
                    raise RuntimeError(f"ring read of partition {part}: {err}")
                log.warning("ring read of partition %d: %s", part, err)
                continue
            row = ring_row(msg)
            if self.slot(row.due_ms) > slot:   # a later turn's: it waits for its own
                return self._read(rows)
            rows.append(row)
        return rows

    def _read(self, rows: list[Row]) -> list[Row]:
        """The open slot is read: the next may open (the task's position of the partition stays
        after its last row read, before any later turn's)."""
        self.consumer.unassign()
        self.reading, self.next_slot = None, self.next_slot + 1
        return rows

    def close(self) -> None:
        self.consumer.close()
