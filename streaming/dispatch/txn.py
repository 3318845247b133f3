"""A dispatch task's transactions (delivery = "exactly_once"; its loop is streaming/dispatch/task.py):
Kafka's consume-transform-produce. The task's producer has a transactional.id of its own, the
same in every run (`<prefix>.<ready partition>`), so a task started again fences the one before
it, and a task lost but still alive (a long pause) can write nothing more. One transaction holds
what the task sent in an interval, to the real topics and the dead-letter topic, and the ledger
rows of all of it: a read_committed consumer sees a message once its transaction commits, and
never twice. The task then commits its input offsets as before, below every row not yet in a
committed transaction's ledger rows. After a crash the new task reads again from there and skips
what the ledger holds (streaming/dispatch/start.py): exactly what committed transactions delivered;
what an aborted one sent is invisible to a read_committed reader, and sent again. (The offsets
are not part of the transaction: librdkafka 2.16's send_offsets_to_transaction waited forever
once the broker had restarted, past its own timeout, and the task with it; issues #5456, #5511.
An offset a fenced task still commits lies below what it delivered, which the ledger covers.)

A refusal aborts the whole transaction (librdkafka's rule): the task starts again from its last
commit in the same worker, and the refused row, read again, is dead-lettered with its reason
instead, or sent alone first when the broker refused its record batch as too large (the
at-least-once path does the same without an abort: streaming/dispatch/send.py). So a row to a topic
that does not exist is not sent at all: its topic is looked up first, and the row waits aside
for the topic as long as the producer would (`topic.metadata.propagation.max.ms`), then is
dead-lettered; sent, it would hold the transaction's commit that long and then abort it. A
partition out of range, or a record larger than the producer takes, is refused before it is
queued, and dead-lettered without an abort. No Spark import.
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException

from streaming.dispatch.rules import TOO_LARGE, Row, refusal

log = logging.getLogger(__name__)


class Aborted(Exception):
    """The task's open transaction cannot commit: it starts again from its last commit."""


class Refusals:
    """What the broker refused, by (Row.source, Row.offset): kept across the task's restarts
    in its worker, so the row is handled otherwise when read again (at least once, `alone` is
    what is being sent again alone at once)."""

    def __init__(self):
        self.reasons: dict[tuple, str] = {}   # dead-lettered with this reason
        self.alone: set[tuple] = set()        # sent in a record batch of its own


# A topic found missing is looked up again at most this often.
_LOOK_AGAIN_S = 0.5


class Transactions:
    """The transaction part of streaming/dispatch/task.py's _Task, which it is mixed into."""

    def __init__(self, refusals: Refusals):
        # Refusals, the open transaction's first failure, whether it holds a record.
        self.refusals, self.doomed, self.in_transaction = refusals, None, False
        self._offsets_at = time.monotonic()   # when the offsets were last committed
        self.at_commit = (0, 0)   # `sent` and `dead` at the last commit
        # Topics known to exist, and those found missing: (first seen, last looked up).
        self._topics: set[str] = set()
        self._missing: dict[str, tuple[float, float]] = {}

    def _topic_ready(self, row: Row) -> bool:
        """Whether `row`'s topic exists, as the producer's metadata says; if not, the row is
        put aside to be tried again, or dead-lettered once the producer's wait has passed."""
        topic = row.topic
        if topic in self._topics:
            return True
        first, looked = self._missing.get(topic, (time.monotonic(), 0.0))
        if time.monotonic() - looked >= _LOOK_AGAIN_S:
            found = self.producer.list_topics(topic, timeout=10).topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                self._topics.add(topic)
                self._missing.pop(topic, None)
                return True
            self._missing[topic] = first, time.monotonic()
        wait_s = self.config.producer.get("topic.metadata.propagation.max.ms", 30_000) / 1000
        if time.monotonic() - first >= wait_s:
            self._dead_letter(row, refusal(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), row))
        else:
            self._later(lambda: self._hold(row), _LOOK_AGAIN_S)
        return False

    def _begin(self) -> None:
        """Fence every earlier producer of this transactional.id (aborting what it left open)
        and open the first transaction."""
        self.producer.init_transactions(60)
        self.producer.begin_transaction()

    def _refused_in_transaction(self, row: Row | None, err) -> None:
        """A send refused: the transaction is lost, and the row's refusal is remembered for
        its next read (a fatal error is raised: a fenced task ends here)."""
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
        """Commit what was queued since the last commit and the ledger rows of all of it, and
        open the next transaction. The rows' acknowledgements come first, so that each ledger
        row names the partition and offset its message landed at; then the ledger rows, whose
        acknowledgements the commit waits for. A refusal aborts it."""
        for _ in range(100):   # records the full queue put back, queued before the commit
            self._release(force=True)
            while self.producer.flush(30) and not self.doomed:   # the broker away: it resumes
                log.warning("dispatch %d: records unacknowledged for 30 s; waiting",
                            self.partition)
            self._ledger(force=True)
            if not self.retry:
                break
        else:
            self.doomed = self.doomed or "the producer's queue stayed full"
        if self.doomed:
            raise Aborted(self.doomed)
        if not self.in_transaction:
            return   # an idle task commits no empty transactions
        self._until_done(lambda: self.producer.commit_transaction(30))
        self.in_transaction = False
        self.at_commit = (self.sent, self.dead)
        self.producer.begin_transaction()

    def _until_done(self, call) -> None:
        """A transaction call, called again while it fails for a reason that passes (the broker
        away: librdkafka resumes where it was); an abortable failure aborts, a fatal one (the task
        fenced) is raised."""
        while True:
            try:
                return call()
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is not None and err.txn_requires_abort():
                    raise Aborted(str(err)) from e
                if err is None or not err.retriable():
                    raise
                log.warning("dispatch %d: committing its transaction: %s; retrying",
                            self.partition, err)

