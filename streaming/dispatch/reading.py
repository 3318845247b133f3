"""A dispatch task's reading: its ready partition's references, the intake partitions it reads
itself (direct.py) and the bodies read back (bodies.py), held or skipped if in the ledger."""
from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from state import headers as H
from streaming.dispatch.bodies import Bodies
from streaming.dispatch.cancels import DIRECT, NOTICE, Tombstones
from streaming.dispatch.direct import direct_rows
from streaming.dispatch.rules import READY_STOP, Offsets, Refired, Row, ready_row
from streaming.dispatch.ring import Ring
from streaming.dispatch.start import (CANCEL_SETTLED, IN_RING, TARGET_DONE, committed,
                                      in_ledger, owned_partitions, retrying)
from state.envelope import TIMER_LEVEL
from state.split import due_after

log = logging.getLogger(__name__)


class Reading:
    """The reading part of a dispatch task (streaming/dispatch/task.py `_Task`)."""

    def __init__(self, config):
        self.bodies = Bodies(config.consumer, config.intake_topic, config.rules, config.fetch_gap,
                             config.read_batch)
        self.intake: list = []   # the intake's TopicPartitions this task reads (direct.py)
        self.paused = False
        self.refired = Refired()
        self.ring = Ring(config.consumer, config.ring, self.partition, config.read_batch) \
            if config.ring is not None and config.ring.slots else None
        # Cancels of what the task holds or will hold, kept a window past their target's due.
        self.tombstones = Tombstones(max(config.direct_max_delay_ms, 0))
        self._known_below = 0   # ready rows below this were done before the start (`Refired`)
        self._gathered: list = []   # intake records read and not yet parsed (`_consume`)
        self._gathered_since = 0.0
        self._urgent = False   # one of them may be due soon (`_due_soon`)
        self._parsed_at = 0.0   # when they were last parsed

    def _resume(self) -> dict[tuple[str, int], int]:
        """Where this run starts: its partitions, their commit points, and what the ledger holds
        from the last mark on (kept for the task's life: a copy read later is a copy still)."""
        consumer, config = self.consumer, self.config
        self.intake = retrying(lambda: owned_partitions(consumer, config, self.partition))
        ring = [] if self.ring is None else [TopicPartition(self.ring.config.topic, p)
                                             for p in self.ring.partitions()]
        starts, mark, batch = retrying(lambda: committed(consumer, config,
                                                         [self.ready, *self.intake, *ring]))
        ends = Consumer({**config.consumer, "isolation.level": "read_uncommitted",
                         "enable.auto.commit": False})
        try:
            done, last, self.ledger_end = in_ledger(
                consumer, ends, self.ledger, mark, config.intake_topic,
                ring[0].topic if ring else None, config.skip_deadline_s)
        finally:
            ends.close()
        self.offsets = {source: Offsets(start, mark or 0, last.get(source, -1))
                        for source, start in starts.items()}
        self._known_below = starts[None]
        for tp in ring:   # their ends, and what waits there (Ring.unread)
            end = retrying(lambda: consumer.get_watermark_offsets(tp, timeout=60))[1]
            self.ring.ends[tp.partition] = end
            self.ring.unread[tp.partition] = max(0, end - starts[(tp.topic, tp.partition)])
        if batch:   # the newest wheel batch's rows below the commit point are read to know them
            self.refired = Refired(*batch)
        return done

    def _consume(self, wait_s: float, done: dict[tuple[str, int], int]) -> None:
        """The ready partition's records and the intake's the task reads itself, waiting up to
        `wait_s` for the first. The intake's are gathered and parsed together every `gather_s`
        (a parse costs about 1 ms however few its records), or `urgent_gather_s` after the
        last parse when one may be due before that (`_due_soon`)."""
        urgent = self._urgent
        for msg in self.consumer.consume(self.config.read_batch, timeout=wait_s):
            if msg.error():   # the client's own report; it reconnects and goes on
                if msg.error().fatal():
                    raise KafkaException(msg.error())
                log.warning("dispatch %d: %s", self.partition, msg.error())
            elif msg.topic() == self.ready.topic:
                self._take(msg, done)
            else:
                if not self._gathered:
                    self._gathered_since = time.monotonic()
                self._gathered.append(msg)
                urgent = urgent or self._due_soon(msg)
        self._urgent, now = urgent, time.monotonic()
        if self._gathered and (urgent and now - self._parsed_at >= self.config.urgent_gather_s
                               or len(self._gathered) >= self.config.read_batch
                               or now - self._gathered_since >= self.config.gather_s):
            intake, self._gathered, self._urgent, self._parsed_at = self._gathered, [], False, now
            self._take_intake(intake, done)

    def _due_soon(self, msg) -> bool:
        """Whether an intake record may be due (or name a cancel's target due) within twice
        `gather_s`, by its headers alone: an immediate message, a past or imminent timer (at
        5,000 timers/s, past ones waited 110 ms at p50 gathered, 39 parsed at every turn; levels
        1-4 parsed at every turn cost the workers 18% more CPU)."""
        append = msg.timestamp()[1]
        after = due_after(msg.headers(), append, self.config.rules.level_delays_ms)[0]
        return after is not None and append + after <= self._now_ms() + 2000 * self.config.gather_s

    def _pace(self) -> None:
        """Bounded memory: stop reading while too many rows are held."""
        held = self._holding() + self.bodies.pending()
        if not self.paused and held >= self.config.max_held:
            self.consumer.pause([self.ready, *self.intake])
            self.paused = True
        elif self.paused and held < self.config.max_held // 2:
            self.consumer.resume([self.ready, *self.intake])
            self.paused = False

    def _assign(self) -> None:
        """Read the ready partition (from the newest wheel batch's first row, if below) and the
        intake partitions from their positions."""
        ready = self.offsets[None].position
        if self.refired.start is not None:
            ready = min(ready, self.refired.start)
        self.consumer.assign([TopicPartition(self.ready.topic, self.partition, ready), *(
            TopicPartition(tp.topic, tp.partition, self.offsets[(tp.topic, tp.partition)].position)
            for tp in self.intake)])

    def _look_for_partitions(self) -> None:
        """Partitions added to the intake since the start, from their beginning, assigned alone:
        reassigning the others would fetch rows gathered and not yet taken twice."""
        new = [tp for tp in retrying(lambda: owned_partitions(self.consumer, self.config,
                                                              self.partition))
               if (tp.topic, tp.partition) not in self.offsets]
        if not new:
            return
        starts = retrying(lambda: committed(self.consumer, self.config, new))[0]
        self.offsets.update({source: Offsets(start) for source, start in starts.items()})
        added = [TopicPartition(topic, part, start) for (topic, part), start in starts.items()]
        self.intake.extend(added)
        log.info("dispatch %d: reading new intake partitions %s", self.partition,
                 [tp.partition for tp in added])
        self.consumer.incremental_assign(added)
        if self.paused:   # a task holding its most keeps every partition paused (`_pace`)
            self.consumer.pause(added)

    def _take_intake(self, msgs: list, done: dict[tuple[str, int], int]) -> None:
        """Intake records: the direct ones are held like fired rows (or skipped, when the
        ledger holds them already), their cancels kept; every other is the wheel's."""
        # correctDeliverTimestamp (state/timing.py) on the broker's clock as read here.
        rows, dead, cancels, others = direct_rows(
            msgs, self.config.rules, self.config.direct_max_delay_ms, self._now_ms(),
            self.config.intake_topic)
        for part, offset in others:
            self.offsets[(self.config.intake_topic, part)].skip(offset)
        for cancel in cancels:
            self._take_cancel(cancel, done, DIRECT)
        window = self.config.direct_max_delay_ms
        for row, reason in [*((row, None) for row in rows), *dead]:
            offsets = self.offsets[row.source]
            if done and done.get((row.uniq_key, row.due_ms), 0) & (TARGET_DONE | IN_RING):
                offsets.skip(row.offset)
                self.skipped += 1
                continue
            offsets.read(row.offset, self.ledger_end)
            self.held[row.level] += 1
            if reason is not None:   # bad input: its dead letter now, with the wheel's reason
                self._dead_letter(row, reason)
            elif self.ring is not None and row.level == TIMER_LEVEL \
                    and row.due_ms - row.append_ms > window \
                    and (row.source, row.offset) not in self.refusals.unringed:
                self._ring_take(row)
            else:
                self._hold(row)

    def _take_cancel(self, cancel: Row, done: dict, side: str, notice: bytes | None = None):
        """A cancel (its uniq_key and due_ms name its target) read from the intake or from the
        wheel's notice, open until its outcome is settled (cancels.py), unless the ledger says
        it is already (a cancel read again after a restart)."""
        offsets = self.offsets[cancel.source]
        if done and done.get((cancel.uniq_key, cancel.due_ms), 0) & CANCEL_SETTLED:
            offsets.skip(cancel.offset)
            return
        offsets.read(cancel.offset, self.ledger_end)
        self.tombstones.add(cancel, side, notice)

    def _take(self, msg, done: dict[tuple[str, int], int]) -> None:
        """One ready record: the run's stop, a row done before the start (known for `Refired`),
        one in the ledger or a refired copy (skipped), or one whose body to read back."""
        offset, headers = msg.offset(), msg.headers() or []
        if headers and headers[-1][0] == READY_STOP:
            self.offsets[None].skip(offset)
            if offset >= self._known_below and (msg.value() or b"").decode() == self.config.run_id:
                self.stopping = True
            return
        row = ready_row(offset, msg.value())
        copy = self.refired.copy(msg.key(), offset, row)
        if offset < self._known_below:
            return
        if headers and headers[-1][0] == H.READY_CANCEL and not copy:   # the wheel's notice
            self._take_cancel(row, done, NOTICE, headers[-1][1])
            return
        if copy or (done and done.get((row.uniq_key, row.due_ms), 0) & TARGET_DONE):
            self.offsets[None].skip(offset)
            self.skipped += 1
            return
        self.offsets[None].read(offset, self.ledger_end)
        self.held[row.level] += 1
        self.bodies.want(row)

    def _read_back(self, wait_s: float) -> bool:
        """Hold the bodies read back, dead-letter references whose record is gone or replaced;
        waits up to `wait_s` for the first. Whether it was reading (and so waited)."""
        reading = self.bodies.pump(wait_s)
        restored, dead = self.bodies.take()
        for row in restored:
            self._hold(row)
        for row, reason in dead:
            self._dead_letter(row, reason)
        return reading
