"""The dispatch task's pure parts (sinks/dispatch.py): reading a fired row back from its ready
record, the commit point, the bound on how far the host's clock runs ahead, and the ledger
records' retry (against a stand-in producer)."""
from types import SimpleNamespace

from confluent_kafka import KafkaError

from sinks.dispatch import (READY_FROM, READY_LEVEL, READY_QID, READY_TOPIC, Offsets, Row, Skew,
                            ready_row)
from state import headers as H


def test_a_ready_record_gives_back_the_message_and_where_it_goes():
    headers = [("trace", b"1"), ("READY_TOPIC_LOOKALIKE", b"x"), (H.UNIQ_KEY, b"u-1"),
               (H.DELIVER_MS, b"1700000000500"), (READY_TOPIC, b"orders"), (READY_QID, b"2"),
               (READY_LEVEL, b"3"), (READY_FROM, b"1-42-1700000000000")]
    row = ready_row(9, b"k", b"v", headers)
    assert (row.due_ms, row.ipart, row.ioff, row.offset) == (1700000000500, 1, 42, 9)
    assert (row.topic, row.partition, row.level, row.append_ms, row.uniq_key) == \
        ("orders", 2, 3, 1700000000000, "u-1")
    assert row.headers == headers[:4], "the message's own headers, in order, as delivered"
    no_qid = ready_row(0, None, b"v", [(H.UNIQ_KEY, b"u"), (H.DELIVER_MS, b"5"),
                                       (READY_TOPIC, b"t"), (READY_LEVEL, b"-1"),
                                       (READY_FROM, b"0-0-1")])
    assert no_qid.partition is None and no_qid.level == -1


def test_the_commit_point_is_the_lowest_row_not_done_with_its_ledger_mark():
    offsets = Offsets(10)
    assert offsets.commit_point(ledger_end=5) == (10, 5), "nothing read: the position"
    offsets.read(10, 5)
    offsets.read(11, 6)
    offsets.skip(12)                    # in the ledger already
    offsets.read(13, 7)
    assert offsets.commit_point(ledger_end=9) == (10, 5)
    offsets.done(11)
    offsets.done(10)
    assert offsets.commit_point(ledger_end=9) == (13, 7)
    offsets.done(13)
    assert offsets.commit_point(ledger_end=9) == (14, 9), "all done: the position, the end"


def test_the_clock_bound_is_the_smallest_of_a_window_and_never_below_zero():
    now = [1000.0]
    skew = Skew(window_s=60, clock=lambda: now[0])
    assert not skew.measured and skew.ahead_ms() == 0
    skew.observe(broker_ms=1000.0 * 1000 - 3050)   # acknowledged 3.05 s after the stamp
    skew.observe(broker_ms=1000.0 * 1000 - 3010)
    assert skew.measured and skew.ahead_ms() == 3010
    now[0] += 61                                    # a new window starts from its first
    skew.observe(broker_ms=now[0] * 1000 - 2500)
    assert skew.ahead_ms() == 2500
    skew.observe(broker_ms=now[0] * 1000 + 40)      # this clock behind: no hold at all
    assert skew.ahead_ms() == 0


class Producer:
    """The client's produce and delivery reports, as a test drives them."""

    def __init__(self):
        self.sent: list[tuple[bytes, object]] = []   # (value, on_delivery)

    def produce(self, topic, value, partition, headers, on_delivery):
        self.sent.append((value, on_delivery))


class Acked:
    def __init__(self, offset):
        self._offset = offset

    def offset(self):
        return self._offset

    def timestamp(self):
        return 0, 0


def test_a_ledger_record_whose_delivery_failed_is_sent_again_itself():
    """Acknowledged rows go to the ledger in records of `ledger_batch` rows; a record the
    broker refused is sent again, not another one, and each record's rows are done once
    it is in."""
    from sinks.dispatch_task import _Task

    task = _Task.__new__(_Task)
    task.config = SimpleNamespace(ledger_batch=2, gather_s=0.0, retry_backoff_s=0.0)
    task.partition, task.ledger, task._sender = 0, SimpleNamespace(topic="ledger"), []
    task.producer, task.retry, task.ledger_end, task._last_ack = Producer(), [], 0, 0.0
    task.offsets, task.held = {None: Offsets(0)}, {1: 4}
    rows = [Row(1000, 0, i, i, "real", None, None, b"v", [], 1, 0, f"u{i}") for i in range(4)]
    for row in rows:
        task.offsets[None].read(row.offset, 0)
    task._unledgered, task._unledgered_since = [(row, 1000, None) for row in rows], 0.0
    task._ledger(force=True)
    (first, first_report), (second, _) = task.producer.sent
    first_report(KafkaError(KafkaError._MSG_TIMED_OUT), None)   # the first one refused
    task._release(force=True)
    again, again_report = task.producer.sent[2]
    assert again == first and again != second
    again_report(None, Acked(7))
    task.producer.sent[1][1](None, Acked(8))
    assert task.held == {1: 0} and task.offsets[None].commit_point(task.ledger_end)[0] == 4
