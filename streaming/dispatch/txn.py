"""A dispatch task's transactions (delivery = "exactly_once"): consume-transform-produce.
Its transactional.id (`<prefix>.<ready partition>`) is the same in every run: a restart fences
the one before. One transaction holds an interval's sends and their ledger rows; the offsets
are committed outside it (librdkafka 2.16's send_offsets_to_transaction hung after a broker
restart: #5456, #5511), and a restart skips what the ledger holds. A refusal aborts the whole
transaction; the row, read again, is dead-lettered or sent alone. No Spark import."""
from __future__ import annotations

import json
import logging
import math
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streaming.dispatch.rules import TOO_LARGE, Row, refusal
from streaming.dispatch.start import Aborted, Stalled, retrying, transient
from streaming.dispatch.topics import Topics

log = logging.getLogger(__name__)


class Refusals:
    """What the broker refused, by (Row.source, Row.offset), kept across the task's restarts in
    its worker so the row is handled otherwise when read again."""

    def __init__(self):
        self.reasons: dict[tuple, str] = {}   # dead-lettered with this reason
        self.alone: set[tuple] = set()        # sent in a record batch of its own
        self.unringed: set[tuple] = set()     # held, not written to the ring that refused it


class Transactions(Topics):
    """The commits and transactions of streaming/dispatch/task.py's _Task, mixed into it: each
    source's commit point with the metadata a restart and the driver's gauges read."""

    def __init__(self, refusals: Refusals):
        # Refusals, the open transaction's first failure, whether it holds a record.
        self.refusals, self.doomed, self.in_transaction = refusals, None, False
        self._offsets_at = time.monotonic()   # when the offsets were last committed
        self.at_commit = (0, 0)   # `sent` and `dead` at the last commit
        self.commit_refused: KafkaException | None = None   # a background commit's, not transient
        # While a commit awaits its acks the intake is read on (`_acks_awaited`): its rows for
        # the ring wait here for the next transaction.
        self.committing, self.deferred = False, []
        # at_least_once (`_watch_acks`): since when the producer was found cut off, the ledger's
        # end then, and when that was checked.
        self._watch: tuple[float | None, int, float] = (None, 0, time.monotonic())
        Topics.__init__(self)

    def _begin(self) -> None:
        """Fence earlier producers of this transactional.id (aborting what they left open)."""
        self.producer.init_transactions(60)
        self.producer.begin_transaction()

    def _refused_in_transaction(self, row: Row | None, err) -> None:
        """A send refused: the transaction is lost; the row's refusal is kept for its next read
        (a fatal error is raised: a fenced task ends here)."""
        self.doomed = self.doomed or str(err)
        if row is None:
            return
        where = (row.source, row.offset)
        if err.code() in TOO_LARGE and where not in self.refusals.alone:
            self.refusals.alone.add(where)
            return
        why = refusal(err, row)
        if why is not None:
            self.refusals.reasons[where] = why

    def _commit_transaction(self) -> None:
        """Commit what was queued and its ledger rows, then open the next transaction. A ledger
        row names where its message landed, so it follows the row's ack: the acked rows' ledger
        records go while the rest are still in flight, then the last ones."""
        for _ in range(100):   # records the full queue put back, queued before the commit
            self._release(force=True)
            self._await_acks()
            if not self.retry or self.doomed:
                break
        else:
            self.doomed = self.doomed or "the producer's queue stayed full"
        if self.doomed:
            raise Aborted(self.doomed)
        if self.in_transaction:   # an idle task commits no empty transactions
            retrying(lambda: self.producer.commit_transaction(30), timeout_s=math.inf)
            self.in_transaction = False
            if self.ring is not None:
                self.ring.dirty.clear()
            self.at_commit = (self.sent, self.dead)
            self.producer.begin_transaction()
        deferred, self.deferred = self.deferred, []
        for row in deferred:
            self._ring_write(row)

    def _commit_hanging(self, topic: str, part: int, filler: list) -> None:
        """Commit the records a commit's lost markers left hanging in `part` of delayq's own
        `topic`: a filler (`filler` its headers) written there in the task's transaction, whose
        commit markers end the producer's whole open transaction in that partition. The task's
        commit of those records returned: they are committed, as the coordinator decided. (Kafka
        4.4 lost a commit's markers when the broker stopped just after it; with librdkafka 2.16's
        transactions, no KIP-890, nothing else ends them but the producer's next commit there.)"""
        log.warning("dispatch %d: %s [%d] ends short of the records the task committed there (the "
                    "broker lost the commit's markers); a filler commits them", self.partition,
                    topic, part)
        refused = lambda err, msg: err and self._refused_in_transaction(None, err)  # noqa: E731
        self.producer.produce(topic, None, None, part, on_delivery=refused, headers=filler)
        self.in_transaction = True
        self._commit_transaction()

    def _ring_committed(self) -> None:
        """What the task wrote to the ring committed, for its read_committed read: a commit
        clears `dirty` before the rows kept for the next transaction are written."""
        if self.txn:
            self._commit_transaction()
        else:
            self.producer.flush(30)
            self.ring.dirty.clear()

    def _await_acks(self) -> None:
        """Every queued record acknowledged and every acked row's ledger record queued (the broker
        away: librdkafka resumes, and this waits), unless a topic records wait for is gone, or
        the producer is cut off (`_cut_off`, and no ack came since the last check) for `stall_s`:
        Stalled. A check's look-ups wait up to 2 s each: about 10 s into the wait, by default."""
        self._ledger(force=True)
        start = checked = time.monotonic()
        cut_off, left = None, math.inf   # since when; the records awaited at the last check
        while self._acks_awaited() and not self.doomed:
            self._ledger(force=True)
            if time.monotonic() - checked >= self.config.ack_check_s:
                checked = time.monotonic()
                acked, left = sum(self.unacked.values()) < left, sum(self.unacked.values())
                if acked or not self._cut_off():
                    cut_off = None
                    if held_up := self._held_up([t for t, n in self.unacked.items() if n > 0]):
                        self.doomed = f"records to {held_up}, unacknowledged for " \
                                      f"{checked - start:.0f} s"
                        return
                elif checked - (cut_off := cut_off or checked) >= self.config.stall_s:
                    raise Stalled(f"its producer had no answer from the broker for "
                                  f"{checked - cut_off:.0f} s while its consumer had, its "
                                  f"records unacknowledged for {checked - start:.0f} s")
            if time.monotonic() - start >= 30:
                log.warning("dispatch %d: records unacknowledged for 30 s; waiting", self.partition)
                start = time.monotonic()
        self._ledger(force=True)

    def _acks_awaited(self) -> int:
        """The records not yet acknowledged after a short wait for them, the intake read and parsed
        meanwhile: its rows are held and those for the ring written in the next transaction (at
        5,000 timers/s the acks' wait was a fifth of a task's time, and the intake waited)."""
        if self.stopping or self.done is None:
            return self.producer.flush(0.1)
        left = self.producer.flush(0.01)
        if left:
            self.committing = True
            try:
                self._consume(0.0, self.done)
            finally:
                self.committing = False
        return left

    def _commit(self, final: bool = False) -> None:
        """Commit the commit point, the `final` one synchronously, others in the background (a
        lost coordinator is awaited up to session.timeout.ms, 45 s, while the loop goes on); a
        transient failure waits for the next. exactly_once: the transaction first, offsets
        every `offsets_interval_s` (rows read again: ledger skips)."""
        if self.txn:
            due = final or time.monotonic() - self._offsets_at >= self.config.offsets_interval_s
            # Taken first, so below what the commit delivers; only when due (a min over held rows).
            commits = self._commit_points() if due else []
            self._commit_transaction()
            if not due:
                return
            self._offsets_at = time.monotonic()
        else:
            self._watch_acks()
            commits = self._commit_points()
        if self.commit_refused is not None:
            raise self.commit_refused
        try:
            self.consumer.commit(offsets=commits, asynchronous=not final)
        except KafkaException as e:
            self.committed(e.args[0], [])
            if self.commit_refused is not None:
                raise

    def _watch_acks(self) -> None:
        """at_least_once, where no commit awaits the acks (`_await_acks`): records unacknowledged,
        no ledger record acknowledged since the last check (every `ack_check_s`; every ack leads
        to one), and the producer cut off (`_cut_off`) at each check for `stall_s`: Stalled. A
        new producer takes over from the last commit; what the old one sent may arrive twice."""
        cut_off, end, checked = self._watch
        now = time.monotonic()
        if not any(n > 0 for n in self.unacked.values()) or self.ledger_end != end:
            self._watch = None, self.ledger_end, now
        elif now - checked >= self.config.ack_check_s:
            if not self._cut_off():
                self._watch = None, end, now
            elif now - (cut_off := cut_off or now) >= self.config.stall_s:
                raise Stalled(f"its producer had no answer from the broker for {now - cut_off:.0f}"
                              f" s while its consumer had, no record acknowledged meanwhile")
            else:
                self._watch = cut_off, end, now

    def committed(self, err: KafkaError | None, partitions: list) -> None:
        """The consumer's on_commit: a transient failure waits for the next commit; any other
        is raised by the next `_commit`."""
        err = err or next((tp.error for tp in partitions if tp.error is not None), None)
        if err is None:
            return
        if not transient(KafkaException(err)):
            self.commit_refused = KafkaException(err)
            return
        log.warning("dispatch %d: commit failed (%s); the next one retries it",
                    self.partition, err)

    def _commit_points(self) -> list:
        commits = []
        for source, offsets in self.offsets.items():
            point, mark = offsets.commit_point(self.ledger_end)
            meta = {"ledger": mark}
            if source is None:   # the driver's gauges, and a beat for its liveness check
                meta["beat"] = time.monotonic_ns() // 1_000_000
                held = self.held + self._in_ring()   # the ring's count as timers held
                meta["held"] = {str(k): n for k, n in held.items() if n}
                if self.refired.batch is not None:
                    meta["batch"] = [self.refired.batch, self.refired.start]
                if self.skew.measured:
                    meta["clock_ms"] = round(self.skew.offset_ms())
                    if self.ring is not None:
                        meta["ring_lag_ms"] = self.ring.lag_ms(self.skew.broker_ms())
            topic, part = (self.ready.topic, self.partition) if source is None else source
            commits.append(TopicPartition(topic, part, point, metadata=json.dumps(meta)))
        return commits
