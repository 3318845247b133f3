"""The ring's part of a dispatch task (streaming/dispatch/task.py's _Task, mixed into it): timers
gathered and written to their slots in the task's transaction, and each slot read when due
(streaming/dispatch/ring.py: the ring itself). No Spark import."""
from __future__ import annotations

import logging
import time
from collections import Counter

from state.envelope import TIMER_LEVEL
from streaming.dispatch.cancels import RINGED
from streaming.dispatch.ring import FILL, RING, ring_value
from streaming.dispatch.rules import PURGED, Row, refusal
from streaming.dispatch.start import TARGET_DONE

log = logging.getLogger(__name__)


class Ringing:
    """The ring's part of streaming/dispatch/task.py's _Task, mixed into it: timers written to
    their slots, the slots read when due."""

    def _ring_take(self, row: Row) -> None:
        """`row`, read for the ring, gathered and written `write_ms` after the first (a
        transaction adds each ring partition it writes and marks it at its end: conf's
        ring_write_ms); meanwhile it holds its intake's commit point, as a held row does. One
        the ring would not take now (overdue, read after an outage) is held at once."""
        ring = self.ring
        if not ring.takes(row, self._now_ms()):
            self._ring_write(row)
            return
        if not ring.gathered:
            ring.gathered_at = time.monotonic()
        ring.gathered.append(row)

    def _ring_write_gathered(self) -> None:
        ring = self.ring
        if ring.gathered and time.monotonic() - ring.gathered_at >= ring.config.write_ms / 1000:
            rows, ring.gathered = ring.gathered, []
            for row in rows:
                self._ring_write(row)

    def _ring_write(self, row: Row) -> None:
        """`row` to its slot's partition of the ring; once acked, its ledger row `ringed`
        (with it in the transaction) settles its intake record. One whose slot was read while it
        waited (a full queue, a retry) is held instead; one read while a commit awaits its acks
        waits for the next transaction (txn.py `_acks_awaited`)."""
        if self.committing:
            self.deferred.append(row)
            return
        if not self.ring.takes(row, self._now_ms()):
            if self._now_ms() < self.ring.first_turn_until:
                self.ring.held_instead.add((row.uniq_key, row.due_ms))
            self._hold(row)
            return
        slot = self.ring.slot(row.due_ms)
        part = self.ring.partition(slot)
        if self._produce(self.ring.config.topic, part, row, [*row.headers, (RING, ring_value(row))],
                         self._ringed):
            self.ring.dirty.add(part)
            self.ring.written[part] = max(slot, self.ring.written.get(part, slot))
        else:   # the producer's queue is full
            self._later(lambda: self._ring_write(row), 0.05)

    def _ringed(self, err, msg, row: Row, sent_ms: int) -> None:
        if err is None:
            part = msg.partition()
            self.ring.ends[part] = msg.offset() + 1
            self.ring.unread[part] = self.ring.unread.get(part, 0) + 1
            row.status = RINGED
            self._acked(row, sent_ms, None)
        elif self.txn and msg is not None:   # queued and refused: the transaction is lost,
            self._refused_in_transaction(None, err)   # and the row, read again, is held
            if err.code() not in PURGED:   # but not for the task's own abort or stall
                self.refusals.unringed.add((row.source, row.offset))
        elif msg is None or refusal(err, row) is not None:   # refused for good: held instead
            self._hold(row)
        else:
            log.warning("dispatch %d: writing %s to the ring failed (%s); retrying",
                        self.partition, row.uniq_key, err)
            self._later(lambda: self._ring_write(row))

    def _in_ring(self) -> Counter:
        """The ring's timers not read yet (Ring.unread), by level."""
        if self.ring is None:
            return Counter()
        return Counter({TIMER_LEVEL: sum(self.ring.unread.values())})

    def _turn_ring(self, done: dict[tuple[str, int], int]) -> None:
        """Write the gathered timers (`_ring_take`); read the next slot when its time comes (after
        what the open transaction wrote there is committed), one at a time, opened while the task
        holds under half its most and read while under its most (beyond, a slot's rows may leave
        out of due order); its rows held, or skipped when the ledger holds them done."""
        ring = self.ring
        if ring is None:
            return
        self._ring_write_gathered()
        if not self.skew.measured:
            return
        if ring.held_instead and self._now_ms() >= ring.first_turn_until:
            ring.held_instead.clear()
        if ring.reading is None:
            part = ring.partition(ring.next_slot)
            slot = ring.due_to_open(self._now_ms(), ring.unread.get(part, 0))
            if slot is None or self._holding() >= self.config.max_held // 2:
                return
            if part in ring.dirty:
                self._ring_committed()
            ring.open(slot, self.offsets[(ring.config.topic, part)].position)
        room = self.config.max_held - self._holding()
        if room <= 0:   # bounded: the rest of the slot waits
            return
        rows = ring.pump(room)
        if self.txn and (hanging := ring.hanging()) is not None:
            self._commit_hanging(ring.config.topic, hanging, [FILL])
        if ring.read_to is not None:   # its position past the markers, which retention may drop
            topic_part = (ring.config.topic, ring.partition(ring.next_slot - 1))
            self.offsets[topic_part].skip(ring.read_to - 1)
            ring.read_to = None
        self._hold_ring_rows(rows, done)

    def _hold_ring_rows(self, rows: list[Row], done: dict[tuple[str, int], int]) -> None:
        ring = self.ring
        for row in rows:
            key = (row.uniq_key, row.due_ms)
            if key in ring.seen or key in ring.held_instead or (
                    done and done.get(key, 0) & TARGET_DONE):
                self.offsets[row.source].skip(row.offset)
                self.skipped += 1
                continue
            ring.seen.add(key)
            self.offsets[row.source].read(row.offset, self.ledger_end)
            self.held[row.level] += 1
            self._hold(row)
