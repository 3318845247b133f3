"""A dispatch task's transactions (delivery = "exactly_once"; its loop is sinks/dispatch_task.py):
Kafka's consume-transform-produce. The task's producer has a transactional.id of its own, the
same in every run (`<prefix>.<ready partition>`), so a task started again fences the one before
it, and a task lost but still alive (a long pause) can write nothing more. One transaction holds
what the task sent in an interval, to the real topics and the dead-letter topic, the ledger rows
of all of it, and its input offsets: a read_committed consumer sees a message once its
transaction commits, and never twice. After a crash the new task reads again from the committed
offsets and skips what the ledger holds (sinks/dispatch_start.py); what the aborted transaction
sent is invisible to a read_committed reader, and sent again.

A refusal aborts the whole transaction (librdkafka's rule): the task starts again from its last
commit in the same worker, and the refused row, read again, is dead-lettered with its reason
instead, or sent alone first when the broker refused its record batch as too large (the
at-least-once path does the same without an abort: sinks/dispatch_send.py). No Spark import.
"""
from __future__ import annotations

import logging

from confluent_kafka import KafkaException

from sinks.dispatch import TOO_LARGE, Row, refusal

log = logging.getLogger(__name__)


class Aborted(Exception):
    """The task's open transaction cannot commit: it starts again from its last commit."""


class Refusals:
    """What the broker refused in aborted transactions, by (Row.source, Row.offset): kept
    across the task's restarts in its worker, so the row is handled otherwise when read again."""

    def __init__(self):
        self.reasons: dict[tuple, str] = {}   # dead-lettered with this reason
        self.alone: set[tuple] = set()        # sent in a record batch of its own


class Transactions:
    """The transaction part of sinks/dispatch_task.py's _Task, which it is mixed into."""

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

    def _commit_transaction(self, commits: list) -> None:
        """Commit what was sent since the last commit with the input offsets `commits`, and
        open the next transaction."""
        if self.doomed:
            raise Aborted(self.doomed)
        try:
            self.producer.send_offsets_to_transaction(
                commits, self.consumer.consumer_group_metadata(), 60)
            self.producer.commit_transaction(60)
        except KafkaException as e:
            if e.args and e.args[0].txn_requires_abort():
                raise Aborted(str(e.args[0])) from e
            raise   # fatal (fenced) or not done in time: the task restarts
        self.at_commit = (self.sent, self.dead)
        self.producer.begin_transaction()

    def _settle(self) -> None:
        """Every send of the transaction acknowledged and its ledger row sent and acknowledged,
        so that no row it delivered lies above the commit point without its ledger row."""
        while True:
            self._release(force=True)
            self.producer.flush(60)
            if self.doomed:
                raise Aborted(self.doomed)
            if not self._unledgered and not self.retry:
                return
            self._ledger(force=True)
