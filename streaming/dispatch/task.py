"""The dispatch task's loop (streaming/dispatch/rules.py has its rules and records): consume the ready
partition's references and read their bodies back from the intake (streaming/dispatch/bodies.py), and the
intake partitions it reads itself (streaming/dispatch/direct.py), hold rows until due, send them and their
ledger rows, commit, and on a restart skip what the ledger already holds
(streaming/dispatch/start.py). No Spark import: it runs in a plain Python worker."""
from __future__ import annotations

import gc
import heapq
import itertools
import json
import logging
import time
from collections import Counter
from typing import Callable, Iterator

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from streaming.dispatch.bodies import Bodies
from streaming.dispatch.direct import direct_rows
from streaming.dispatch.send import Sending
from streaming.dispatch.rules import (READY_STOP, SENDER, DispatchConfig, Offsets, Refired, Row, Skew,
                            identity, ready_row, sender)
from streaming.dispatch.start import (added_partitions, committed, in_ledger, owned_partitions,
                                  retrying, transient)
from streaming.dispatch.txn import Aborted, Refusals, Transactions

log = logging.getLogger(__name__)

# The task's Python collects cycles after this many allocations (CPython's default: 700). A task
# holds hundreds of thousands of rows, each a few objects, and allocates several per message:
# at the default, collecting took about a third of its CPU (streaming/tools/bench_readback.py,
# 200,000 references: 73 µs a message against 41, the last sent 4.8 s after the due time
# against 2.7 s). Its rows form no cycles; what it frees, reference counting frees.
GC_THRESHOLD = (50_000, 20, 100)


def run_partition(config: DispatchConfig, partition: int,
                  clock: Callable[[], float] = time.time) -> Iterator[dict]:
    """The task's whole life: dispatch `partition` until its stop record for this run, then
    yield what it did ({"partition", "sent", "dead", "skipped"}). Raises on a failure that a
    new task must take over (the supervisor starts it again from the committed offset)."""
    gc.set_threshold(*GC_THRESHOLD)   # the worker runs this task alone, for its whole life
    refusals, done = Refusals(), Counter()
    while True:   # again from the last commit after an aborted transaction (streaming/dispatch/txn.py)
        task = _Task(config, partition, clock, refusals)
        try:
            task.run()
            break
        except Aborted as e:
            log.warning("dispatch %d: its transaction was aborted (%s); reading again from its "
                        "last commit", partition, e)
            task.producer.abort_transaction(60)
            task.sent, task.dead = task.at_commit   # what the aborted one sent does not count
        finally:
            task.close()
            done.update(sent=task.sent, dead=task.dead, skipped=task.skipped)
        time.sleep(config.retry_backoff_s)
    yield {"partition": partition, "sent": done["sent"], "dead": done["dead"],
           "skipped": done["skipped"]}


class _Task(Sending, Transactions):
    """One run of a dispatch task over its ready partition (see `run_partition`)."""

    def __init__(self, config: DispatchConfig, partition: int, clock: Callable[[], float],
                 refusals: Refusals):
        self.config, self.partition, self.clock = config, partition, clock
        self.ready = TopicPartition(config.ready_topic, partition)
        self.ledger = TopicPartition(config.ledger_topic, partition)
        self.consumer = Consumer({**config.consumer, "enable.auto.commit": False,
                                  "auto.offset.reset": "error"})
        self.txn = bool(config.transactional_id)
        self.producer = Producer({**config.producer, "transactional.id":
                                  f"{config.transactional_id}.{partition}"} if self.txn
                                 else config.producer)
        # The transactions' (streaming/dispatch/txn.py): refusals, the open one's first failure,
        # whether it holds a record.
        self.refusals, self.doomed, self.in_transaction = refusals, None, False
        self._offsets_at = time.monotonic()   # when the offsets were last committed
        self.at_commit = (0, 0)   # `sent` and `dead` at the last commit
        # Topics known to exist, and those found missing: (first seen, last looked up).
        self._topics: set[str] = set()
        self._missing: dict[str, tuple[float, float]] = {}
        self.bodies = Bodies(config.consumer, config.intake_topic, config.rules, config.fetch_gap)
        self.skew = Skew(config.ledger_topic, config.clock_tolerance_ms, clock=clock)
        self.heap: list[tuple] = []     # (*Row.order(), push number, row) of each held row
        self._pushes = itertools.count()   # equal orders never compare their rows
        # Sends to try again later, (monotonic time, send): librdkafka retries what it queued,
        # not a record its full queue refused, a topic not yet known, or a dead letter refused.
        self.retry: list[tuple[float, Callable[[], bool | None]]] = []
        self.ledger_end = 0
        self.sent = self.dead = self.skipped = 0
        self.stopping = self.paused = False
        self.offsets: dict = {None: Offsets(0)}   # Row.source → its rows read and not done
        self.intake: list = []   # the intake's TopicPartitions this task reads (streaming/dispatch/direct.py)
        self._last_ack = 0.0
        self.refired = Refired()
        self._known_below = 0   # ready rows below this were done before the start (`Refired`)
        # Acknowledged, ledger row not yet sent: (row, sent_ms, dead letter's reason or None).
        self._unledgered: list[tuple[Row, int, str | None]] = []
        self._unledgered_since = 0.0   # when the first of them was acknowledged (monotonic)
        self._gathered: list = []   # intake records read and not yet parsed (`gather_s`)
        self._gathered_since = 0.0
        self._sender = [(SENDER, sender())]
        self.held: Counter[int] = Counter()   # rows read and not yet in the ledger, by level
        self._refused: set = set()   # a dead letter's (source, offset), a ledger send: said once

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        consumer, config = self.consumer, self.config
        if self.txn:   # first: what an earlier run left open is aborted before anything is read
            retrying(self._begin)
        self.intake = retrying(lambda: owned_partitions(consumer, config, self.partition))
        starts, mark, batch = retrying(lambda: committed(consumer, config,
                                                         [self.ready, *self.intake]))
        # What the ledger holds from the last commit's mark on: kept for the task's life (a
        # few commit intervals' deliveries); a copy of one read later is a copy still.
        done, last, self.ledger_end = retrying(lambda: in_ledger(
            consumer, self.ledger, mark, config.intake_topic))
        self.offsets = {source: Offsets(start, mark or 0, last.get(source, -1))
                        for source, start in starts.items()}
        self._known_below = starts[None]
        if batch:   # the newest wheel batch's rows below the commit point are read to know them
            self.refired = Refired(*batch)
        self._probe(wait=True)
        self._assign()
        last_commit = looked = time.monotonic()
        while not self.stopping:
            self._release()
            # The loop waits for records in the consumer that has work: the read-back's while
            # references wait for their bodies (the ready partition's records are taken as they
            # come, without waiting), else the task's own.
            wait_s = self._wait_s()
            if self._read_back(wait_s):
                wait_s = 0.0
            self._send_due()
            self.producer.poll(0)
            self._ledger()
            self._pace()
            self._consume(wait_s, done)
            if config.direct_max_delay_ms >= 0 \
                    and time.monotonic() - looked >= config.intake_refresh_s:
                self._look_for_partitions()
                looked = time.monotonic()
            if time.monotonic() - last_commit >= config.commit_interval_s:
                self._commit()
                last_commit = time.monotonic()
            # Unmeasured (nothing is sent until then), it probes again after the retry back-off.
            if time.monotonic() - self._last_ack > (config.probe_interval_s if self.skew.measured
                                                    else config.retry_backoff_s):
                self._probe()
        # A clean stop: what was handed to the producer is acknowledged (and its ledger row
        # with it) before the commit, so the next run skips it; rows not yet due stay above
        # the commit point and are read again.
        for _ in range(3):
            self.producer.flush(30)
            self._ledger(force=True)
            self._release(force=True)
        self._commit(final=True)

    def _consume(self, wait_s: float, done: set[tuple[str, int]]) -> None:
        """The ready partition's records and the intake's the task reads itself (gathered, and
        parsed together every `gather_s`), waiting up to `wait_s` for the first."""
        for msg in self.consumer.consume(5000, timeout=wait_s):
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
        if self._gathered and (len(self._gathered) >= self.config.ledger_batch or
                               time.monotonic() - self._gathered_since >= self.config.gather_s):
            intake, self._gathered = self._gathered, []
            self._take_intake(intake, done)

    def close(self) -> None:
        try:
            self.consumer.close()
            self.bodies.close()
        finally:
            self.producer.flush(10)

    def _now_ms(self) -> int:
        """The broker's clock as this host reads it (`Skew`: never ahead of the broker's);
        this host's own until it is measured."""
        return self.skew.broker_ms() if self.skew.measured else int(self.clock() * 1000)

    def _wait_s(self) -> float:
        if not self.heap or not self.skew.measured:
            return 0.02
        return min(0.02, max(0.0, (self.heap[0][0] - self._now_ms()) / 1000))

    def _hold(self, row: Row) -> None:
        heapq.heappush(self.heap, (*row.order(), next(self._pushes), row))

    def _pace(self) -> None:
        """Bounded memory: stop reading while too many rows are held."""
        held = len(self.heap) + self.bodies.pending()
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
        """Partitions added to the intake since the start, read from their beginning (so are
        the wheel's), added alone: the others read on from their fetch position, not from what
        this task took of them (rows gathered and not yet taken would be fetched twice)."""
        starts = retrying(lambda: added_partitions(self.consumer, self.config, self.partition,
                                                   self.offsets))
        if not starts:
            return
        self.offsets.update({source: Offsets(start) for source, start in starts.items()})
        added = [TopicPartition(topic, part, start) for (topic, part), start in starts.items()]
        self.intake.extend(added)
        log.info("dispatch %d: reading new intake partitions %s", self.partition,
                 [tp.partition for tp in added])
        self.consumer.incremental_assign(added)
        if self.paused:   # a task holding its most keeps every partition paused (`_pace`)
            self.consumer.pause(added)

    def _take_intake(self, msgs: list, done: set[tuple[str, int]]) -> None:
        """Intake records: the direct ones are held like fired rows (or skipped, when the
        ledger holds them already), every other is the wheel's."""
        # correctDeliverTimestamp (state/timing.py) on the broker's clock as read here.
        rows, dead, others = direct_rows(msgs, self.config.rules, self.config.direct_max_delay_ms,
                                         self._now_ms(), self.config.intake_topic)
        for part, offset in others:
            self.offsets[(self.config.intake_topic, part)].skip(offset)
        for row, reason in [*((row, None) for row in rows), *dead]:
            offsets = self.offsets[row.source]
            if done and identity(row.uniq_key, row.due_ms) in done:
                offsets.skip(row.offset)
                self.skipped += 1
                continue
            offsets.read(row.offset, self.ledger_end)
            self.held[row.level] += 1
            if reason is None:
                self._hold(row)
            else:   # bad input: its dead letter now, with the wheel's reason
                self._dead_letter(row, reason)

    def _take(self, msg, done: set[tuple[str, int]]) -> None:
        """One ready record: the run's stop, a row done before the start (only known, for
        `Refired`), a message the ledger holds already or a wheel batch's copy (skipped), or a
        row to hold until due."""
        offset, headers = msg.offset(), msg.headers() or []
        if headers and headers[-1][0] == READY_STOP:
            self.offsets[None].skip(offset)
            if offset >= self._known_below and (msg.value() or b"").decode() == self.config.run_id:
                self.stopping = True
            return
        row = ready_row(offset, msg.key(), msg.value(), headers)
        copy = not headers and self.refired.copy(msg.key(), offset, row)
        if offset < self._known_below:
            return
        if copy or (done and identity(row.uniq_key, row.due_ms) in done):
            self.offsets[None].skip(offset)
            self.skipped += 1
            return
        self.offsets[None].read(offset, self.ledger_end)
        self.held[row.level] += 1
        if row.body:
            self._hold(row)
        else:
            self.bodies.want(row)

    def _read_back(self, wait_s: float) -> bool:
        """The references' bodies read back from the intake: held until due, or, for a record
        gone or not the one referenced, dead-lettered (with the reference's headers). Waits up
        to `wait_s` for the first of them; whether it was reading (and so waited)."""
        reading = self.bodies.pump(wait_s)
        restored, dead = self.bodies.take()
        for row in restored:
            self._hold(row)
        for row, reason in dead:
            self._dead_letter(row, reason)
        return reading

    def _send_due(self) -> None:
        """Send every held row due by the broker's clock, up to the first reference still
        without its body; none before that clock is measured."""
        if not self.skew.measured:
            return
        heap, pop, produce, delivered = self.heap, heapq.heappop, self._produce, self._delivered
        broker_ms, first = self.skew.broker_ms, self.bodies.first_wanted()
        refusals = self.refusals
        while heap and heap[0][0] <= broker_ms() and (first is None or heap[0][:3] < first):
            row = pop(heap)[-1]
            if refusals.reasons or refusals.alone:   # refused in an aborted transaction
                where = (row.source, row.offset)
                if where in refusals.reasons:
                    self._dead_letter(row, refusals.reasons[where])
                    continue
                if where in refusals.alone:
                    self._send_alone(row)
                    continue
            if self.txn and not self._topic_ready(row):
                continue
            if not produce(row.topic, row.partition, row, row.headers, delivered):
                self._hold(row)   # the producer's queue is full: later
                return

    def _later(self, send: Callable[[], bool | None], delay_s: float | None = None) -> None:
        """Call `send` again after a back-off (the retry's, or `delay_s`); a send that returns
        False (the producer's queue was full) is put back the same way."""
        self.retry.append((time.monotonic() + (delay_s if delay_s is not None
                                               else self.config.retry_backoff_s), send))

    def _release(self, force: bool = False) -> None:
        if not self.retry:
            return
        now = time.monotonic()
        due = [send for at, send in self.retry if force or at <= now]
        self.retry = [(at, send) for at, send in self.retry if not (force or at <= now)]
        for send in due:
            if send() is False:
                self._later(send, 0.05)

    def _commit(self, final: bool = False) -> None:
        """Commit the commit point; a transient failure waits for the next commit. With
        exactly_once, the transaction first, and the offsets every `offsets_interval_s` and at
        the end (a crash reads the rows between again, and the ledger skips them)."""
        if self.txn:
            due = final or time.monotonic() - self._offsets_at >= self.config.offsets_interval_s
            # Taken first, so below what the transaction's commit delivers; only when due (the
            # commit point is a minimum over every held row).
            commits = self._commit_points() if due else []
            self._commit_transaction()
            if not due:
                return
            self._offsets_at = time.monotonic()
        else:
            commits = self._commit_points()
        try:
            self.consumer.commit(offsets=commits, asynchronous=False)
        except KafkaException as e:
            if not transient(e):
                raise
            log.warning("dispatch %d: commit failed (%s); the next one retries it",
                        self.partition, e)

    def _commit_points(self) -> list:
        """Each source's commit point, with the metadata the driver's gauges read."""
        commits = []
        for source, offsets in self.offsets.items():
            point, mark = offsets.commit_point(self.ledger_end)
            meta = {"ledger": mark}
            if source is None:   # the task's held rows and clock, for the driver's gauges,
                # and a beat that changes at every commit (the driver's liveness check)
                meta["beat"] = time.monotonic_ns() // 1_000_000
                meta["held"] = {str(k): n for k, n in self.held.items() if n}
                if self.refired.batch is not None:
                    meta["batch"] = [self.refired.batch, self.refired.start]
                if self.skew.measured:
                    meta["clock_ms"] = round(self.skew.offset_ms())
            topic, part = (self.ready.topic, self.partition) if source is None else source
            commits.append(TopicPartition(topic, part, point, metadata=json.dumps(meta)))
        return commits
