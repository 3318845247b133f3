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
import time
from dataclasses import dataclass

from typing import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streaming.dispatch.bodies import PUMP_S
from streaming.dispatch.rules import Row

log = logging.getLogger(__name__)

# A ring record's header: what its row needs besides its message and delivered headers.
RING = "DELAYQ_RING"
# The only header of a filler: a record of no timer, written to commit a hanging transaction's
# records (txn.py `_commit_hanging`); a read skips it.
FILL = (RING, b"fill")


@dataclass(frozen=True)
class RingConfig:
    topic: str
    slots: int       # N, per task (0: no ring)
    slot_ms: int     # w
    lead_ms: int     # a slot is read this long before it starts
    lead_per_message_us: int = 0   # ... and this much earlier per record it holds
    markers_wait_ms: int = 5_000   # a read short of a commit this long: its markers were lost
    write_ms: int = 0   # timers for the ring are gathered this long, then written (0: at once)


def ring_value(row: Row) -> bytes:
    """The RING header of `row`: due, level, append time, intake partition and offset, topic and
    partition (empty: the partitioner's)."""
    qid = "" if row.partition is None else row.partition
    return (f"{row.due_ms},{row.level},{row.append_ms},{row.ipart},{row.ioff},{row.topic},{qid}"
            .encode())


def ring_row(msg, headers: list | None = None) -> Row:
    """A ring record as the row it was written from, its source the ring (`headers`: if read)."""
    headers = headers or msg.headers() or []
    due, level, append, ipart, ioff, topic, qid = headers[-1][1].decode().split(",")
    delivered = headers[:-1]   # the message's own headers, then UNIQ_KEY and DELIVER_MS
    return Row(int(due), int(ipart), int(ioff), msg.offset(), topic, int(qid) if qid else None,
               msg.key(), msg.value(), delivered, int(level), int(append),
               delivered[-2][1].decode(), source=(msg.topic(), msg.partition()))


class Ring:
    """The ring of task `task`: where a timer is written, which slot is read next, and the reads
    (a consumer of its own, never committed: the task's commits cover the ring's sources)."""

    def __init__(self, consumer_config: dict, config: RingConfig, task: int,
                 read_batch: int):
        self.config, self.task, self.read_batch = config, task, read_batch
        self.ends: dict[int, int] = {}   # partition → its end as the task last knew it
        # partition → its timers not read yet: those the task wrote, and what lay between its
        # position and the end at its start (there, until read, transaction markers count too)
        self.unread: dict[int, int] = {}
        self.consumer = Consumer({
            **consumer_config, "enable.auto.commit": False, "auto.offset.reset": "error",
            "enable.partition.eof": True, "isolation.level": "read_committed",
            # a slot is read at once to its end: no waiting there for records to come
            "fetch.wait.max.ms": 10})
        self.next_slot: int | None = None   # the first slot not yet read (`open`)
        self.reading: tuple[int, int] | None = None   # (slot, partition) being read
        self.until = 0   # the open slot's partition is read to here at least (`open`)
        self.read_to: int | None = None   # where its read ended, past markers (`pump`)
        self.short_since: float | None = None   # since when its read ends short (`hanging`)
        # The keys the open slot's read took: at least once, a restart between a ring write's
        # ack and its ledger row's writes the timer again, next to the first (same due, slot).
        self.seen: set[tuple[str, int]] = set()
        # And the keys of ring timers held instead while the slots written before the start are
        # read (`start`): a copy of one may wait there, written before its ledger row was.
        self.held_instead: set[tuple[str, int]] = set()
        self.first_turn_until = 0
        self.dirty: set[int] = set()   # partitions written in the open transaction
        self.gathered: list[Row] = []   # timers read for the ring, not yet written (`_ring_take`)
        self.gathered_at = 0.0   # when the first of them was read (monotonic)
        self.written: dict[int, int] = {}   # partition → the latest slot written there

    def partitions(self) -> list[int]:
        n = self.config.slots
        return list(range(self.task * n, (self.task + 1) * n))

    def partition(self, slot: int) -> int:
        return self.task * self.config.slots + slot % self.config.slots

    def slot(self, due_ms: int) -> int:
        return due_ms // self.config.slot_ms

    def start(self, now_ms: int, positions: dict[int, int]) -> None:
        """A turn back from now, or from the oldest slot a stopped task left (`_oldest`) if it
        was down longer: every partition is read once more, oldest slot first, so what it left
        there leaves in due order (overdue rows at once)."""
        turn_back = self.slot(now_ms) - self.config.slots + 1
        self.next_slot = min([turn_back, *self._oldest(positions)])
        self.first_turn_until = (turn_back + 2 * self.config.slots) * self.config.slot_ms

    def _oldest(self, positions: dict[int, int]) -> list[int]:
        """The slot of the first row at the task's position (`positions`, by partition) of each
        partition where rows wait: their slots never decrease along a partition (`takes`)."""
        found = []
        for part in sorted(part for part, n in self.unread.items() if n > 0):
            self.consumer.assign([TopicPartition(self.config.topic, part, positions[part])])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:   # past fillers, to a row or the end
                msg = next(iter(self.consumer.consume(1, timeout=0.5)), None)
                if msg is None or msg.error() is None and msg.headers() == [FILL]:
                    continue
                if msg.error() is None:
                    found.append(self.slot(ring_row(msg).due_ms))
                if msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF:
                    break
            self.consumer.unassign()
        return found

    def takes(self, row: Row, now_ms: int) -> bool:
        """Whether `row` (a timer in the ring's band) goes to the ring: its slot is not read yet
        and it is not due within the read lead; else the task holds it."""
        slot = self.slot(row.due_ms)
        # Never behind a later turn's row (a clock stepped back): it would wait a turn there.
        return (slot > self.next_slot and row.due_ms > now_ms + self.config.lead_ms
                and slot >= self.written.get(self.partition(slot), slot))

    def due_to_open(self, now_ms: int, unread: int = 0) -> int | None:
        """The next slot to read, if its time has come (earlier by the `unread` records of its
        partition: a burst due in one slot is read and held before it starts) and no slot is
        being read."""
        slot = self.next_slot
        lead = self.config.lead_ms + unread * self.config.lead_per_message_us // 1000
        if self.reading is None and slot * self.config.slot_ms - lead <= now_ms:
            return slot
        return None

    def lag_ms(self, now_ms: int) -> int:
        """How long past its time the next slot waits to be read (0: on time)."""
        return max(0, now_ms - (self.next_slot * self.config.slot_ms - self.config.lead_ms))

    def open(self, slot: int, position: int) -> None:
        """Read `slot`'s partition forward from `position` to at least its end as the task knows
        it (the task is its only writer): a transaction's commit returns before its markers are
        written, and until then a read_committed read ends short of what it committed."""
        part = self.partition(slot)
        self.until, self.read_to, self.seen = self.ends.get(part, 0), None, set()
        self.short_since = None
        if position >= self.until:
            self.next_slot = slot + 1
            return
        self.reading = slot, part
        self.consumer.assign([TopicPartition(self.config.topic, part, position)])

    def pump(self, room: int, wait_s: float = 0.0) -> list[Row]:
        """The open slot's rows read now, about `room` at most (whole fetches of `read_batch`):
        those of its turn or an earlier one; at the first row of a later turn, or the
        partition's end, the slot is read and the next one may open."""
        if self.reading is None:
            return []
        slot, part = self.reading
        rows, deadline = [], time.monotonic() + PUMP_S
        for msg in self._fetched(wait_s, deadline, lambda: len(rows) < room):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= self.until:   # past the markers too: the task's position
                        self.read_to = msg.offset()
                        self.unread[part] = 0
                        return self._read(rows)
                    # the commit's markers are not written yet
                    self.short_since = self.short_since or time.monotonic()
                    continue
                if err.fatal() or err.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise RuntimeError(f"ring read of partition {part}: {err}")
                log.warning("ring read of partition %d: %s", part, err)
                continue
            self.short_since = None
            if (headers := msg.headers()) == [FILL]:
                continue
            row = ring_row(msg, headers)
            if self.slot(row.due_ms) > slot:   # a later turn's: it waits for its own
                return self._read(rows)
            self.unread[part] = max(0, self.unread.get(part, 0) - 1)
            rows.append(row)
        return rows

    def hanging(self) -> int | None:
        """The open slot's partition if its read has ended short of the end the task knows for
        `markers_wait_ms`: the broker lost the markers of a commit that wrote there (seen when it
        restarted at that moment), and read_committed reads stop before those records until
        another transaction of the task's producer writes there and commits. Named once per
        wait."""
        if self.reading is None or self.short_since is None or \
                time.monotonic() - self.short_since < self.config.markers_wait_ms / 1000:
            return None
        self.short_since = None
        return self.reading[1]

    def _fetched(self, wait_s: float, deadline: float, more: Callable[[], bool]) -> Iterator:
        """Records fetched, `read_batch` at a time, for up to PUMP_S (the task sends what is due
        between two pumps) and while `more()`."""
        while True:
            msgs = self.consumer.consume(self.read_batch, timeout=wait_s)
            yield from msgs
            wait_s = 0
            if not msgs or time.monotonic() >= deadline or not more():
                return

    def _read(self, rows: list[Row]) -> list[Row]:
        """The open slot is read: the next may open (the task's position of the partition stays
        after its last row read, before any later turn's)."""
        self.consumer.unassign()
        self.reading, self.next_slot, self.short_since = None, self.next_slot + 1, None
        return rows

    def close(self) -> None:
        self.consumer.close()
