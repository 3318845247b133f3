"""A dispatch task's sends and their acks: a row to its real topic, stamped with the broker's
clock and never before its due time; a refusal retried if transient, else dead-lettered (in a
transaction, txn.py, the transaction is lost); acked rows into ledger records. No Spark import."""
from __future__ import annotations

import logging
import time
from collections import Counter

from confluent_kafka import KafkaException

from streaming.dispatch.rules import PURGED, TOO_LARGE, Row, dead_letter_headers, refusal
from streaming.ledger.records import PROBE, SENDER, ledger_chunks, sender

log = logging.getLogger(__name__)


class Sending:
    """The send path of streaming/dispatch/task.py's _Task, which it is mixed into: it uses the
    task's producer, clock (`_now_ms`), retries (`_later`) and counters."""

    def __init__(self):
        # Acked, ledger row not yet sent: (row, sent_ms, reason or None, (partition, offset)).
        self._unledgered: list[tuple] = []
        self._unledgered_since = 0.0   # when the first of them was acknowledged (monotonic)
        self._sender = [(SENDER, sender())]
        self._last_ack = 0.0
        self._refused: set = set()   # a dead letter's (source, offset), a ledger send: said once
        self.unacked: Counter[str] = Counter()   # records queued and not yet acked, by topic

    def _produce(self, topic: str, partition: int | None, row: Row, headers, callback) -> bool:
        """`row` to the producer, stamped with the broker's clock here, never before its due."""
        sent_ms, unacked = self._now_ms(), self.unacked

        def report(err, msg):
            unacked[topic] -= 1
            if err is not None and not self.txn and err.code() in PURGED:
                return   # at_least_once: its stall's purge; the next task reads the row again
            callback(err, msg, row, sent_ms)
        try:   # partition -1: librdkafka's partitioner places it
            self.producer.produce(topic, row.value, row.key, -1 if partition is None else partition,
                                  on_delivery=report, headers=headers,
                                  timestamp=max(sent_ms, row.due_ms))
        except BufferError:
            self.producer.poll(0.05)
            return False
        except KafkaException as e:   # refused before it was queued (no such partition)
            callback(e.args[0], None, row, sent_ms)
            return True
        unacked[topic] += 1
        if self.txn:
            self.in_transaction = True
        return True

    # Acknowledgements, called from producer.poll.
    def _delivered(self, err, msg, row: Row, sent_ms: int) -> None:
        if err is None:
            self.sent += 1
            self._acked(row, sent_ms, None, (msg.partition(), msg.offset()))
            return
        if self.txn and msg is not None:   # queued and refused: the transaction is lost
            self._refused_in_transaction(row, err)
            return
        reason = refusal(err, row)
        if err.code() in TOO_LARGE and (row.source, row.offset) not in self.refusals.alone:
            # The broker refuses a whole batch too large: sent alone, a row is refused only if it
            # is too large itself (Kafka's Java producer splits such a batch the same way).
            self.refusals.alone.add((row.source, row.offset))
            self._later(lambda: self._send_alone(row), 0.0)
            return
        if reason is None:
            log.warning("dispatch %d: sending %s to %s failed (%s); retrying", self.partition,
                        row.uniq_key, row.topic, err)
            self._later(lambda: self._produce(row.topic, row.partition, row, row.headers,
                                              self._delivered))
            return
        self._dead_letter(row, reason)

    def _send_alone(self, row: Row) -> bool:
        """`row` in a record batch of its own: what is queued leaves first, then the row."""
        self.producer.flush(30)
        sent = self._produce(row.topic, row.partition, row, row.headers, self._delivered)
        self.producer.flush(30)
        return sent

    def _dead_letter(self, row: Row, reason: str) -> None:
        sent = self._produce(self.config.dlq_topic, None, row, dead_letter_headers(row, reason),
                             lambda e, m, r, s: self._dead_lettered(e, r, s, reason))
        if not sent:
            self._later(lambda: self._dead_letter(row, reason), 0.05)

    def _dead_lettered(self, err, row: Row, sent_ms: int, reason: str) -> None:
        if err is not None and self.txn:
            self._refused_in_transaction(None, err)
            return
        if err is not None:   # the commit point stays below the row until it is taken
            if (row.source, row.offset) not in self._refused:   # said once, not at every retry
                self._refused.add((row.source, row.offset))
                log.warning("dispatch %d: the dead-letter topic %s refused %s (%s); retrying "
                            "until it takes it", self.partition, self.config.dlq_topic,
                            row.uniq_key, err)
            self._later(lambda: self._dead_letter(row, reason))
            return
        self._refused.discard((row.source, row.offset))
        self.dead += 1
        self._acked(row, sent_ms, reason)

    def _acked(self, row: Row, sent_ms: int, reason: str | None,
               landed: tuple[int, int] | None = None) -> None:
        if not self._unledgered:
            self._unledgered_since = time.monotonic()
        self._unledgered.append((row, sent_ms, reason, landed))

    def _ledger(self, force: bool = False) -> None:
        """Send the ledger rows of what was acked (`ledger_chunks`), once `gather_s` has passed
        since the first or `ledger_batch` are waiting; rows are done once the ledger has them."""
        batch = self.config.ledger_batch
        if not self._unledgered or not force and len(self._unledgered) < batch \
                and time.monotonic() - self._unledgered_since < self.config.gather_s:
            return
        acked, self._unledgered = self._unledgered, []
        ring = self.ring.config.topic if self.ring is not None else None
        for rows, record in ledger_chunks(acked, batch, self.config.ledger_bytes, ring):
            send = LedgerSend(self, record, rows)
            if not send():
                self._later(send, 0.05)

    def _ledgered(self, err, msg, rows: list[Row], send) -> None:
        if err is not None and self.txn and msg is not None:
            self._refused_in_transaction(None, err)
            return
        if err is not None and (send is None or err.code() in PURGED):   # a probe; a stall's purge
            return
        if err is not None:   # its rows stay below the commit point until the ledger has them
            if send not in self._refused:   # said once, not at every retry
                self._refused.add(send)
                log.warning("dispatch %d: the ledger topic %s refused a record of %d rows (%s); "
                            "retrying until it takes it", self.partition, self.ledger.topic,
                            len(rows), err)
            self._later(send)
            return
        self._refused.discard(send)
        self.ledger_end = max(self.ledger_end, msg.offset() + 1)
        self.skew.observe(*msg.timestamp())
        self._last_ack = time.monotonic()
        for row in rows:
            self.offsets[row.source].done(row.offset)
            self.held[row.level] -= 1
            if row.cancel is not None:   # a cancel's outcome: its tombstone is settled
                row.cancel.settled = True
                if row.cancel.ended:
                    self._settled(row.cancel)

    def _probe(self, wait: bool = False) -> None:
        """An empty ledger record whose ack measures the clock (Skew); the ledger query ignores
        it; at the start, nothing is sent until then (`wait`: its ack or its failure awaited,
        a minute at most). Lost: not sent again; unmeasured, the task's loop probes again."""
        self._last_ack = time.monotonic()
        failed = []

        def probed(err, msg) -> None:
            if err is not None:
                failed.append(err)
            self._ledgered(err, msg, [], None)
        try:
            self.producer.produce(self.ledger.topic, value=b"", headers=[(PROBE, b"1")],
                                  partition=self.partition, on_delivery=probed)
            self.in_transaction = True
        except BufferError:   # the next one goes at its interval
            pass
        deadline = time.monotonic() + 60
        while wait and not (self.skew.measured or failed) and time.monotonic() < deadline:
            self.producer.poll(0.05)
            self._release()


class LedgerSend:
    """The send of one ledger record, called again after a failed delivery. An object, not a
    closure that names itself: that cycle left every record's rows to Python's cyclic GC (at
    5,000 timers/s, 80,000 objects a collection; pauses up to 518 ms)."""

    def __init__(self, task: Sending, record: bytes, rows: list[Row]):
        self.task, self.record, self.rows = task, record, rows

    def __call__(self) -> bool:
        task = self.task
        try:
            task.producer.produce(task.ledger.topic, value=self.record, partition=task.partition,
                                  headers=task._sender, on_delivery=self._delivered)
        except BufferError:
            return False
        except KafkaException as e:   # refused before it was queued
            task._ledgered(e.args[0], None, self.rows, self)
            return True
        task.in_transaction = True
        return True

    def _delivered(self, err, msg) -> None:
        self.task._ledgered(err, msg, self.rows, self)
