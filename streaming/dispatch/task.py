"""The dispatch task's loop: read (reading.py), hold until due, send (send.py) and commit
(txn.py). No Spark import: it runs in a plain Python worker."""
from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from typing import Callable, Iterator

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from streaming.dispatch.cancels import CANCELLED, MISSED, Tombstone
from streaming.dispatch.clock import Skew
from streaming.dispatch.priority import lower_jvm
from streaming.dispatch.reading import Reading
from streaming.dispatch.ringing import Ringing
from streaming.dispatch.rules import DispatchConfig, Offsets, Row, refusal
from streaming.dispatch.send import Sending
from streaming.dispatch.start import Aborted, Stalled, retrying
from streaming.dispatch.txn import Refusals, Transactions
from state import worker
from state.envelope import is_legacy

log = logging.getLogger(__name__)


def run_partition(config: DispatchConfig, partition: int,
                  clock: Callable[[], float] = time.time) -> Iterator[dict]:
    """Dispatch `partition` until this run's stop record, then yield what it did. Raises on a
    failure a new task must take over (the supervisor restarts it from the committed offset)."""
    worker.run_one_task()
    lower_jvm(config.jvm_nice)
    refusals, done = Refusals(), Counter()
    while True:   # again from the last commit after an aborted transaction (txn.py)
        task = _Task(config, partition, clock, refusals)
        try:
            task.run()
            break
        except Aborted as e:
            log.warning("dispatch %d: its transaction was aborted (%s); reading again from its "
                        "last commit", partition, e)
            task.producer.abort_transaction(60)
            task.sent, task.dead = task.at_commit   # what the aborted one sent does not count
        except Stalled as e:
            log.warning("dispatch %d: %s; a new producer takes over from its last commit",
                        partition, e)
            task.producer.purge(blocking=False)   # reports served in close(); the next fences it
            task.stalled = True
            if task.txn:   # its open transaction's sends do not count (at_least_once: delivered)
                task.sent, task.dead = task.at_commit
        finally:
            task.close()
            done.update(sent=task.sent, dead=task.dead, skipped=task.skipped)
            task = None
            worker.thaw()
        time.sleep(config.retry_backoff_s)
    yield {"partition": partition, **done}


class _Task(Reading, Ringing, Sending, Transactions):
    """One run of a dispatch task over its ready partition (see `run_partition`)."""

    def __init__(self, config: DispatchConfig, partition: int, clock: Callable[[], float],
                 refusals: Refusals):
        self.config, self.partition, self.clock = config, partition, clock
        self.ready = TopicPartition(config.ready_topic, partition)
        self.ledger = TopicPartition(config.ledger_topic, partition)
        self.consumer = Consumer({**config.consumer, "enable.auto.commit": False,
                                  "auto.offset.reset": "error", "on_commit": self.committed})
        self.txn = bool(config.transactional_id)
        self.producer = Producer({**config.producer, "transactional.id":
                                  f"{config.transactional_id}.{partition}"} if self.txn
                                 else config.producer)
        self.skew = Skew(config.ledger_topic, config.clock_tolerance_ms, clock=clock)
        self.heap: list[tuple] = []     # (*Row.order(), push number, row) of each held row
        # Heap entries due, set aside behind a reference of their intake partition that waits
        # for its body (`_send_due`): a heap per partition.
        self.behind: dict[int, list[tuple]] = {}
        # Heap entries due whose real topic takes no records yet (topics.py `_topic_ready`): a heap
        # per topic, back in the heap at once when it does (the topic is looked up every 0.5 s).
        self.aside: dict[str, list[tuple]] = {}
        self._pushes = itertools.count()   # equal orders never compare their rows
        # Sends to try again later, (monotonic time, send): librdkafka retries what it queued,
        # not a record its full queue refused, a topic not yet known, or a dead letter refused.
        self.retry: list[tuple[float, Callable[[], bool | None]]] = []
        self.ledger_end = 0
        self.sent = self.dead = self.skipped = 0
        self.stopping = self.stalled = False
        self.done: dict | None = None   # what the ledger held at the start (`_resume`)
        self.held: Counter[int] = Counter()   # rows read and not yet in the ledger, by level
        self.offsets: dict = {None: Offsets(0)}   # Row.source → its rows read and not done
        Reading.__init__(self, config)
        Sending.__init__(self)
        Transactions.__init__(self, refusals)

    def run(self) -> None:
        config = self.config
        if self.txn:   # first: what an earlier run left open is aborted before anything is read
            retrying(self._begin)
        done = self.done = self._resume()
        self._probe(wait=True)
        if self.ring is not None:
            topic = self.ring.config.topic
            self.ring.start(self._now_ms(), {part: self.offsets[(topic, part)].position
                                             for part in self.ring.partitions()})
        self._assign()
        last_commit = looked = time.monotonic()
        while not self.stopping:
            self._release()
            worker.freeze_held()
            # Wait in the consumer that has work: the read-back's while references wait for their
            # bodies (ready records are taken as they come), else the task's own.
            wait_s = self._wait_s()
            if self._read_back(wait_s):
                wait_s = 0.0
            self._turn_ring(done)
            self._send_due()
            self._expire()
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
        self._finish()

    def _finish(self) -> None:
        """A clean stop: what the producer holds is acked, with its ledger row, before the commit
        (the next run skips it); rows not yet due stay above the commit point."""
        for _ in range(3):
            self.producer.flush(30)
            self._ledger(force=True)
            self._release(force=True)
        self._commit(final=True)

    def close(self) -> None:
        try:
            self.consumer.close()
            self.bodies.close()
            if self.ring is not None:
                self.ring.close()
        finally:
            self.producer.flush(2 if self.stalled else 10)
            # Its on_commit is a method of this task: without the cycle, an aborted task (its
            # heap) is freed at once, not at the next full collection (rare: state/worker.py).
            self.consumer = None

    def _now_ms(self) -> int:
        """The broker's clock as this host reads it (`Skew`: never ahead of the broker's);
        this host's own until it is measured."""
        return self.skew.broker_ms() if self.skew.measured else int(self.clock() * 1000)

    def _wait_s(self) -> float:
        if not self.heap or not self.skew.measured:
            return 0.02
        return min(0.02, max(0.0, (self.heap[0][0] - self._now_ms()) / 1000))

    def _holding(self) -> int:
        """Rows held: in the heap, set aside behind a reference, and aside for their topic."""
        return len(self.heap) + sum(map(len, self.behind.values())) + \
            sum(map(len, self.aside.values()))

    def _hold(self, row: Row) -> None:
        heapq.heappush(self.heap, (*row.order(), next(self._pushes), row))

    def _send_due(self) -> None:
        """Send the held rows due by the broker's clock, `read_batch` in a turn (a burst leaves
        in many transactions, each visible to read_committed readers as it commits), none
        before that clock is measured. A row due after a reference of its intake partition
        still without its body waits aside for it (one key's order); the others go on."""
        if not self.skew.measured:
            return
        heap, pop, produce, delivered = self.heap, heapq.heappop, self._produce, self._delivered
        if self.behind:
            self._unblock()
        if self.aside:
            self._look_aside()
        broker_ms, first = self.skew.broker_ms, self.bodies.first_wanted()
        refusals = self.refusals
        for _ in range(self.config.read_batch):
            if not heap or heap[0][0] > broker_ms():
                return
            if first is not None and heap[0][:3] >= first:
                wanted = self.bodies.first_wanted(heap[0][1])
                if wanted is not None and heap[0][:3] >= wanted:
                    heapq.heappush(self.behind.setdefault(heap[0][1], []), pop(heap))
                    continue
            entry = pop(heap)
            row = entry[-1]
            if self.tombstones and (tomb := self.tombstones.drop(row)) is not None:
                self._cancelled(row, tomb)
                continue
            # Refused in an aborted transaction: dead-lettered, or sent alone (after its topic).
            if refusals.reasons and (row.source, row.offset) in refusals.reasons:
                self._dead_letter(row, refusals.reasons[(row.source, row.offset)])
                continue
            if self.txn and self._not_sendable(entry):
                continue
            if refusals.alone and (row.source, row.offset) in refusals.alone:
                self._send_alone(row)
                continue
            if not produce(row.topic, row.partition, row, row.headers, delivered):
                self._hold(row)   # the producer's queue is full: later
                return

    def _unblock(self) -> None:
        """Rows set aside behind a reference back into the heap once it has its body (or is
        dead-lettered): those before their partition's earliest reference still waiting."""
        for p, entries in list(self.behind.items()):
            wanted = self.bodies.first_wanted(p)
            while entries and (wanted is None or entries[0][:3] < wanted):
                heapq.heappush(self.heap, heapq.heappop(entries))
            if not entries:
                del self.behind[p]

    def _not_sendable(self, entry: tuple) -> bool:
        """Whether the row of heap `entry` is not sent now (exactly_once): behind its topic's
        rows aside, or its topic takes no records yet, it waits aside (one key's order); its
        topic found gone, it is dead-lettered."""
        row = entry[-1]
        ready = None if row.topic in self.aside else self._topic_ready(row.topic)
        if ready is None:
            heapq.heappush(self.aside.setdefault(row.topic, []), entry)
        elif ready is False:
            self._dead_letter(row, refusal(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), row))
        return ready is not True

    def _look_aside(self) -> None:
        """A topic's rows aside back into the heap once it takes records, or once it is found
        gone (they are dead-lettered as they leave the heap)."""
        for topic in list(self.aside):
            if self._topic_ready(topic) is not None:
                for entry in self.aside.pop(topic):
                    heapq.heappush(self.heap, entry)

    def _cancelled(self, row: Row, tomb: Tombstone) -> None:
        """`row` dropped by a cancel: its ledger row says so and settles the tombstone; a copy
        of it dropped again is done (the first's ledger row stands for both)."""
        if tomb.dropped is None:
            tomb.dropped = "task"
            row.status, row.cancel = CANCELLED, tomb
            self._acked(row, self._now_ms(), None)
        else:
            self.offsets[row.source].done(row.offset)
            self.held[row.level] -= 1

    def _expire(self) -> None:
        """Tombstones that end (cancels.py): one that dropped nothing is a miss, with a ledger
        row of its own that settles it; the rows of a settled one are done."""
        if not self.tombstones or not self.skew.measured:
            return
        heads = [self.heap[0][0]] if self.heap else []
        heads += [entries[0][0] for entries in self.aside.values()]
        if (wanted := self.bodies.first_wanted()) is not None:
            heads.append(wanted[0])
        if self.ring is not None:   # a target may be in a slot not read yet
            heads.append(self.ring.next_slot * self.ring.config.slot_ms)
        legacy = lambda part, offset: is_legacy(self.config.rules, part, offset)   # noqa: E731
        for tomb in self.tombstones.ended(self.skew.broker_ms(), min(heads, default=None),
                                          legacy):
            if tomb.dropped is None:
                miss = tomb.members[0]
                miss.status, miss.cancel = MISSED, tomb
                self.held[miss.level] += 1   # its ledger row counts it out as a held row's
                self._acked(miss, self._now_ms(), None)
            elif tomb.settled:
                self._settled(tomb)

    def _settled(self, tomb: Tombstone) -> None:
        """The rows of an ended tombstone's cancels are done: its outcome is durable."""
        for member in tomb.members:
            self.offsets[member.source].done(member.offset)

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
