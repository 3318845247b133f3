"""The dispatch task's pure parts (streaming/dispatch/rules.py): reading a fired row back from its ready
record, the commit point, a wheel batch's copies, the host clock's offset to the broker's, the ledger records' size and
their retry, the intake read during a commit's ack wait (against a stand-in producer)."""
import gc
import time
from collections import Counter
from contextlib import nullcontext
from types import SimpleNamespace

import pyarrow as pa
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError

from streaming.dispatch.rules import Offsets, Refired, Row, dead_letter_headers, ready_row
from streaming.ledger.records import ledger_chunks, ledger_rows, ledger_schema
from streaming.dispatch.clock import Skew
from state import headers as H
from state.errors import DispatchError

LOG_APPEND = TIMESTAMP_LOG_APPEND_TIME


def test_a_reference_reads_back_from_its_value_and_its_dead_letter_names_its_record():
    row = ready_row(7, b"1700000000500,4,3,42,1700000000000,order,1,x")
    assert (row.due_ms, row.level, row.ipart, row.ioff, row.append_ms, row.offset) == \
        (1700000000500, 4, 3, 42, 1700000000000, 7)
    assert row.uniq_key == "order,1,x", "a UNIQ_KEY may hold commas: it comes last"
    assert not row.body and row.topic is None and row.headers == []
    assert dead_letter_headers(row, "intake_record_gone: x") == [
        (H.UNIQ_KEY, b"order,1,x"), (H.DELIVER_MS, b"1700000000500"),
        ("DELAYQ_INTAKE_RECORD", b"3-42"), (H.DLQ_REASON, b"intake_record_gone: x")]


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


def test_after_a_restart_the_mark_waits_for_the_rows_an_earlier_run_delivered():
    """Started at 10 with mark 5, rows up to 13 delivered by the run before (their ledger rows
    from 5 on): while the commit point is at or below 13, the mark stays at 5."""
    offsets = Offsets(10, floor=5, earlier=13)
    assert offsets.commit_point(ledger_end=9) == (10, 5), "nothing read yet"
    offsets.read(10, 9)
    offsets.skip(11)
    assert offsets.commit_point(ledger_end=12) == (10, 5), "row 10 read at 9: still 5"
    offsets.done(10)
    offsets.skip(12)
    offsets.skip(13)
    assert offsets.commit_point(ledger_end=12) == (14, 12), "past row 13: the ledger's end"


def test_a_wheel_batch_s_copies_are_known_by_its_id_and_nothing_else_is_skipped():
    ref = lambda uniq, due=5: ready_row(0, f"{due},1,0,0,1,{uniq}".encode())
    refired = Refired()
    assert [refired.copy(b"7", off, ref(u)) for off, u in enumerate("abc", 100)] == [False] * 3
    assert (refired.batch, refired.start) == (7, 100), "the batch and its first offset"
    assert refired.copy(b"7", 103, ref("b")) and refired.copy(b"7", 104, ref("a")), \
        "the same batch written again: copies"
    assert not refired.copy(b"7", 105, ref("b", due=6)), "another due time: a resend, sent"
    assert not refired.copy(b"8", 107, ref("a")), "the next batch may hold the same message"
    assert (refired.batch, refired.start) == (8, 107)
    assert not refired.copy(b"0", 108, ref("a")), "a new checkpoint numbers its batches again"
    again = Refired(8, 107)   # a restart, from the commit's metadata
    assert not again.copy(b"8", 107, ref("a")) and again.copy(b"8", 110, ref("a"))
    assert (again.batch, again.start) == (8, 107)


def test_the_clock_offset_is_the_smallest_bound_of_a_window_either_way():
    """The offset (this host minus the broker) is bounded from above by each acknowledgement;
    the broker's clock read through it is never ahead of the broker's own, whether this host's
    clock runs ahead of the broker's or trails it, and a step of the wall clock moves nothing."""
    wall, mono = [1000.0], [50.0]
    skew = Skew("ledger", 60_000, window_s=60, clock=lambda: wall[0], monotonic=lambda: mono[0])
    assert not skew.measured and skew.offset_ms() is None
    skew.observe(LOG_APPEND, 1000.0 * 1000 - 3050)   # acknowledged 3.05 s after the stamp
    skew.observe(LOG_APPEND, 1000.0 * 1000 - 3010)
    assert skew.measured and skew.offset_ms() == 3010
    assert skew.broker_ms() == 1000.0 * 1000 - 3010
    wall[0] += 61
    mono[0] += 61                                   # a new window starts from its first
    skew.observe(LOG_APPEND, wall[0] * 1000 - 2500)
    assert skew.offset_ms() == 2500
    skew.observe(LOG_APPEND, wall[0] * 1000 + 5040)  # this clock 5.04 s behind, at least
    assert skew.offset_ms() == -5040
    assert skew.broker_ms() == wall[0] * 1000 + 5040, "rows leave by the broker's clock"
    wall[0] += 30                                   # NTP steps the wall clock 30 s ahead
    assert skew.broker_ms() == (wall[0] - 30) * 1000 + 5040, "the hold does not move"
    assert skew.offset_ms() == 30_000 - 5040, "the offset says so"


class Producer:
    """The client's produce and delivery reports, as a test drives them."""

    def __init__(self):
        self.sent: list[tuple[bytes, object]] = []   # (value, on_delivery)

    def produce(self, topic, value, partition, headers, on_delivery):
        self.sent.append((value, on_delivery))


class Acked:
    def __init__(self, offset, kind=TIMESTAMP_LOG_APPEND_TIME):
        self._offset, self._kind = offset, kind

    def offset(self):
        return self._offset

    def timestamp(self):
        return self._kind, 0


def test_a_ledger_record_whose_delivery_failed_is_sent_again_itself():
    """Acknowledged rows go to the ledger in records of `ledger_batch` rows; a record the
    broker refused is sent again, not another one, and each record's rows are done once
    it is in."""
    task = _acked_task(4)
    task._ledger(force=True)
    (first, first_report), (second, _) = task.producer.sent
    first_report(KafkaError(KafkaError._MSG_TIMED_OUT), None)   # the first one refused
    task._release(force=True)
    again, again_report = task.producer.sent[2]
    assert again == first and again != second
    again_report(None, Acked(7))
    task.producer.sent[1][1](None, Acked(8))
    assert task.held == {1: 0} and task.offsets[None].commit_point(task.ledger_end)[0] == 4
    with pytest.raises(DispatchError, match="message.timestamp.type=LogAppendTime"):
        again_report(None, Acked(9, kind=TIMESTAMP_CREATE_TIME))   # no clock to measure by


def test_ledger_records_acked_leave_no_garbage_for_the_cyclic_gc():
    """A ledger send is freed with its rows once acked: as a closure naming itself it left them
    to Python's cyclic GC, whose pauses in a busy task took up to 518 ms."""
    _acked_task(1)._ledger(force=True)   # what the first task imports, made before the count
    gc.collect()
    gc.disable()
    try:
        task = _acked_task(4)
        task._ledger(force=True)
        for _value, report in task.producer.sent:
            report(None, Acked(7))
        del report
        task.producer.sent.clear()
        assert task.held == {1: 0}
        assert gc.collect() == 0
    finally:
        gc.enable()


def _acked_task(n: int):
    """A task with `n` rows acked and their ledger rows to send, two to a record."""
    from streaming.dispatch.task import _Task

    task = _Task.__new__(_Task)
    task.config = SimpleNamespace(ledger_batch=2, ledger_bytes=1_000_000, gather_s=0.0,
                                  retry_backoff_s=0.0, clock_tolerance_ms=60_000)
    task.skew, task._refused, task.txn = Skew("ledger", 60_000), set(), False
    task.partition, task.ledger, task._sender = 0, SimpleNamespace(topic="ledger"), []
    task.producer, task.retry, task.ledger_end, task._last_ack = Producer(), [], 0, 0.0
    task.ring = None
    task.offsets, task.held = {None: Offsets(0)}, {1: n}
    rows = [Row(1000, 0, i, i, "real", None, None, b"v", [], 1, 0, f"u{i}") for i in range(n)]
    for row in rows:
        task.offsets[None].read(row.offset, 0)
    task._unledgered = [(row, 1000, None, (0, i)) for i, row in enumerate(rows)]
    task._unledgered_since = 0.0
    return task


def test_a_probe_refused_at_the_start_ends_the_wait_for_it_and_nothing_is_sent_unmeasured():
    """At a task's start nothing is sent until a probe's ack measures the clock. A refused
    probe (the broker just back, say) held the start for the wait's whole minute, sending
    nothing; its failure ends the wait, the clock still unmeasured, for the task's loop to
    probe again."""
    import time as clock

    from streaming.dispatch.task import _Task

    class Refusing(Producer):
        def poll(self, timeout):
            for _value, report in self.sent[self.polled:]:
                report(KafkaError(KafkaError.INVALID_TXN_STATE), None)
            self.polled = len(self.sent)

    task = _Task.__new__(_Task)
    task.skew, task.txn, task.partition = Skew("ledger", 60_000), True, 0
    task.ledger, task.producer = SimpleNamespace(topic="ledger"), Refusing()
    task.producer.polled, task._release = 0, lambda: None
    started = clock.monotonic()
    task._probe(wait=True)
    assert clock.monotonic() - started < 1, "the wait ended with the probe's failure"
    assert len(task.producer.sent) == 1 and not task.skew.measured


def _acked(n: int, body: int, dead: bool) -> list:
    reason = "unknown_topic: REAL_TOPIC 'gone' does not exist" if dead else None
    return [(Row(1000 + i, 0, i, i, "gone", None, b"k", b"v" * body, [("trace", b"t")], 1, 0,
                 f"u{i:06d}"), 1000 + i, reason, None if dead else (3, 500 + i))
            for i in range(n)]


@pytest.mark.parametrize("body,dead,rows", [(1024, True, 3_000), (10, False, 5_000),
                                            (200_000, True, 30)])
def test_ledger_records_stay_below_the_byte_limit_and_keep_every_row_in_order(body, dead, rows):
    """Dead letters carry their message for the dead-letter table: 3,000 of 1 KB (a REAL_TOPIC
    deleted under load) would make one record of 3 MB."""
    acked = _acked(rows, body, dead)
    chunks = list(ledger_chunks(acked, 2_000, 1_000_000))
    assert all(len(record) <= 1_000_000 for _, record in chunks)
    assert all(len(chunk) <= 2_000 for chunk, _ in chunks)
    keys = [k for _, record in chunks for k in ledger_rows(record).column("uniq_key").to_pylist()]
    assert keys == [row.uniq_key for row, *_ in acked]
    assert [row for chunk, _ in chunks for row in chunk] == [row for row, *_ in acked]
    values = [v for _, record in chunks for v in ledger_rows(record).column("value").to_pylist()]
    assert values == [b"v" * body if dead else None] * rows


def test_a_ledger_row_names_where_its_message_landed_and_an_older_record_reads_null_there():
    """The partition is the one the record landed at (the producer's partitioner chose it: no
    REAL_QID); a record written before the offset column existed reads it as null."""
    [(_, record)] = ledger_chunks(_acked(2, 10, False), 2_000, 1_000_000)
    rows = ledger_rows(record).to_pylist()
    assert [(r["partition"], r["offset"]) for r in rows] == [(3, 500), (3, 501)]
    table = ledger_rows(record).drop_columns(["offset"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    older = ledger_rows(sink.getvalue().to_pybytes())
    assert older.schema == ledger_schema() and older.column("offset").to_pylist() == [None] * 2


def test_a_dead_letter_too_large_for_any_ledger_record_is_recorded_without_its_message():
    acked = _acked(1, 2_000_000, True) + _acked(1, 10, True)
    [(rows, record)] = ledger_chunks(acked, 2_000, 1_000_000)
    big, small = ledger_rows(record).to_pylist()
    assert (big["status"], big["key"], big["value"], big["headers"]) == ("dead", None, None, None)
    assert big["reason"].startswith("unknown_topic") and len(record) < 10_000
    assert small["value"] == b"v" * 10, "a dead letter that fits keeps its message"


def test_an_offset_past_half_the_tolerance_is_said_once_and_its_return_too(caplog):
    mono = [0.0]
    skew = Skew("ledger", 60_000, window_s=1, clock=lambda: mono[0], monotonic=lambda: mono[0])
    with caplog.at_level("INFO", logger="streaming.dispatch.clock"):
        skew.observe(LOG_APPEND, -31_000)            # this host 31 s ahead of the broker
        mono[0] += 0.5
        skew.observe(LOG_APPEND, mono[0] * 1000 - 31_000)
        mono[0] += 2                                  # a new window: 2 s ahead
        skew.observe(LOG_APPEND, mono[0] * 1000 - 2_000)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO"]
    assert "31.0 s ahead of the broker's (ledger), more than half of clock_tolerance (60 s)" \
        in said[0][1]
    assert "2.0 s ahead" in said[1][1] and "within half" in said[1][1]


class _Unreadable:
    """A consumer of a ledger partition whose records never come: each poll reports `error`."""

    def __init__(self, error: KafkaError):
        self.error, self.assigned = error, None

    def get_watermark_offsets(self, tp, timeout):
        return 0, 10

    def assign(self, parts):
        self.assigned = parts

    def unassign(self):
        self.assigned = None

    def consume(self, n, timeout):
        return [SimpleNamespace(error=lambda: self.error)]

    def position(self, parts):
        return [SimpleNamespace(offset=0)]


def test_the_restart_skip_reads_the_whole_ledger_or_fails_the_task():
    from confluent_kafka import KafkaException, TopicPartition

    from streaming.dispatch.start import in_ledger

    ledger = TopicPartition("x.LEDGER", 0)
    slow = _Unreadable(KafkaError(KafkaError._TRANSPORT))   # transient: waited out, then fails
    with pytest.raises(DispatchError, match=r"ledger partition 0 only to offset 0 of 10 in 0 s"):
        in_ledger(slow, slow, ledger, None, "x", None, deadline_s=0.2)
    assert slow.assigned is None
    denied = _Unreadable(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))   # at once
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        in_ledger(denied, denied, ledger, None, "x", None, deadline_s=60)


def test_a_topic_look_up_without_an_answer_never_dead_letters_and_a_missing_topic_does():
    """A REAL_TOPIC not known yet is looked up: no answer in time (the broker away) keeps the
    row aside, never dead-lettered for it; an answer that the topic does not exist dead-letters
    the row once the producer's own wait has passed since that answer; a topic that exists but
    is stuck (a partition without a leader, or short of in-sync replicas) keeps it aside until
    it takes records again, and one already sent to dooms the transaction that waits on it."""
    from confluent_kafka import KafkaException

    from streaming.dispatch.txn import Transactions

    class Metadata:
        answer: object = KafkaException(KafkaError(KafkaError._TIMED_OUT))

        def list_topics(self, topic, timeout):
            if isinstance(self.answer, Exception):
                raise self.answer
            return SimpleNamespace(topics=self.answer)

    task = Transactions.__new__(Transactions)
    Transactions.__init__(task, None)
    task.producer = Metadata()
    task.config = SimpleNamespace(producer={"topic.metadata.propagation.max.ms": 0})
    task.partition = 0
    assert task._topic_ready("gone") is None, "no answer: aside"
    assert task._gone(["gone"]) == [], "no answer: not gone (a transaction waits on)"
    task._missing["gone"] = (None, 0.0)   # looked up again now: it does not exist
    task.producer.answer = {}
    assert task._topic_ready("gone") is False, "missing for the producer's wait (0 here)"
    assert task._gone(["gone"]) == ["gone"]
    # A topic that exists but takes nothing: its rows wait, never dead-lettered for it.
    insync = SimpleNamespace(value="2")

    class Admin:
        def describe_configs(self, resources, request_timeout):
            future = SimpleNamespace(result=lambda timeout: {"min.insync.replicas": insync})
            return {resources[0]: future}

    task._admin = Admin()
    one = SimpleNamespace(id=0, leader=1, error=None, isrs=[1], replicas=[1, 2, 3])
    for partition, why in [(SimpleNamespace(id=0, leader=-1, error=None, isrs=[], replicas=[3]),
                            "whose partition 0 has no leader"),
                           (one, "whose partition 0 has 1 in-sync replicas of the 2 its "
                                 "min.insync.replicas asks")]:
        task._missing.clear()
        task.producer.answer = {"here": SimpleNamespace(error=None, partitions={0: partition})}
        assert task._stuck("here") == why
        assert task._topic_ready("here") is None
        task._missing["here"] = (None, -1e9)   # long ago: still not dead-lettered
        assert task._topic_ready("here") is None
        assert task._held_up(["here"]) is None, "a topic not sent to yet holds nothing up"
        task._topics.add("here")
        assert task._held_up(["here"]) == f"here, {why}" and "here" not in task._topics
    one.replicas = [1]   # the broker asks no more in sync than there are replicas
    task._missing["here"] = (None, 0.0)
    assert task._topic_ready("here") is True and task._topic_ready("here") is True


def test_a_topic_that_takes_no_records_holds_its_rows_aside_and_not_the_others():
    """exactly_once: the due rows of a topic not taking records wait aside, all of them, not
    cycled through the heap (thousands took each turn's sends from the other topics); they are
    held rows (`dispatch_max_held`); once the topic takes records they leave in due order,
    before its later rows; found gone, they are dead-lettered."""
    import heapq

    from streaming.dispatch.task import _Task

    task = _Task.__new__(_Task)
    task.heap, task.behind, task.aside = [], {}, {}
    task.bodies = SimpleNamespace(first_wanted=lambda p=None: None)
    task.skew = SimpleNamespace(measured=True, broker_ms=lambda: 10_000)
    task.config = SimpleNamespace(read_batch=100)
    task.tombstones, task.refusals, task.txn = None, SimpleNamespace(reasons={}, alone=set()), True
    ready = {"other": True, "stuck": None}
    looked = []

    def topic_ready(topic):
        looked.append(topic)
        return ready[topic]
    task._topic_ready = topic_ready
    sent, dead = [], []
    task._dead_letter = lambda row, why: dead.append((row.uniq_key, why))

    def produce(topic, partition, row, headers, callback):
        sent.append(row.uniq_key)
        return True
    task._produce = produce

    def hold(rows):
        for row in rows:
            heapq.heappush(task.heap, (*row.order(), row.offset, row))
    hold(Row(1_000 + i, 0, i, i, "stuck", None, None, b"v", [], 1, 0, f"s{i}") for i in range(500))
    hold([Row(1_250, 1, 900, 900, "other", None, None, b"v", [], 1, 0, "o1")])
    for _ in range(6):   # a read_batch of 100 a turn: the stuck ones do not take them again
        task._send_due()
    assert sent == ["o1"] and len(task.aside["stuck"]) == 500 and task._holding() == 500
    assert looked.count("stuck") < 10, "a topic aside is looked up per turn, not per row"
    # A later row of it, refused in a batch too large before (sent alone), waits behind them.
    task.refusals.alone.add((None, 600))
    task._send_alone = lambda row: sent.append(f"alone {row.uniq_key}")
    hold([Row(1_300, 1, 901, 901, "other", None, None, b"v", [], 1, 0, "o2"),
          Row(5_000, 0, 600, 600, "stuck", None, None, b"v", [], 1, 0, "s-later")])
    task._send_due()
    assert sent == ["o1", "o2"] and len(task.aside["stuck"]) == 501
    ready["stuck"] = True
    for _ in range(6):
        task._send_due()
    assert sent[2:] == [f"s{i}" for i in range(500)] + ["alone s-later"] and task.aside == {}
    # Found gone: dead-lettered as they leave.
    ready["gone"] = None
    hold([Row(9_000, 0, 700, 700, "gone", None, None, b"v", [], 1, 0, "g1")])
    task._send_due()
    assert task.aside["gone"] and dead == []
    ready["gone"] = False
    task._send_due()
    assert [key for key, _ in dead] == ["g1"] and dead[0][1].startswith("unknown_topic")


def test_a_commit_goes_on_in_the_background_and_only_a_lasting_refusal_stops_the_task():
    """Commits but the final one do not wait (a lost coordinator is awaited up to 45 s): a
    transient failure waits for the next commit; any other is raised by the next commit."""
    from confluent_kafka import KafkaException

    from streaming.dispatch.txn import Transactions

    class Consumer:
        def __init__(self):
            self.calls = []

        def commit(self, offsets, asynchronous):
            self.calls.append(asynchronous)

    task = Transactions.__new__(Transactions)
    Transactions.__init__(task, None)
    task.txn, task.partition, task.consumer = False, 0, Consumer()
    task.unacked, task.ledger_end = Counter(), 0   # nothing awaited: no producer to watch
    task._commit_points = lambda: []
    task._commit()
    task._commit(final=True)
    assert task.consumer.calls == [True, False]
    task.committed(KafkaError(KafkaError._WAIT_COORD), [])
    task.committed(None, [SimpleNamespace(error=KafkaError(KafkaError.REQUEST_TIMED_OUT))])
    task._commit()
    assert task.commit_refused is None
    task.committed(None, [SimpleNamespace(error=KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))])
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED"):
        task._commit()


def test_a_row_waits_only_behind_its_own_intake_partition_s_reference_without_a_body():
    """Due rows leave in due order; one due after a reference of its intake partition still
    without its body waits aside until that reference has it (one key's order), and goes back
    in order; rows of other partitions go on meanwhile."""
    import heapq

    from streaming.dispatch.task import _Task

    class Bodies:
        wanted: dict = {0: (1_000, 0, 50)}   # partition 0's reference at offset 50, due 1,000

        def first_wanted(self, p=None):
            return min(self.wanted.values()) if p is None and self.wanted else \
                self.wanted.get(p)

    task = _Task.__new__(_Task)
    task.heap, task.behind, task.aside, task.bodies = [], {}, {}, Bodies()
    task.skew = SimpleNamespace(measured=True, broker_ms=lambda: 10_000)
    task.config = SimpleNamespace(read_batch=100)
    task.tombstones, task.refusals, task.txn = None, SimpleNamespace(reasons={}, alone=set()), False
    sent = []

    def produce(topic, partition, row, headers, callback):
        sent.append(row.uniq_key)
        return True
    task._produce = produce
    rows = [Row(900, 0, 10, 1, "t", None, None, b"v", [], 1, 0, "p0-before"),
            Row(1_100, 0, 60, 2, "t", None, None, b"v", [], 1, 0, "p0-after"),
            Row(1_200, 0, 61, 3, "t", None, None, b"v", [], 1, 0, "p0-later"),
            Row(1_150, 1, 5, 4, "t", None, None, b"v", [], 1, 0, "p1")]
    for n, row in enumerate(rows):
        heapq.heappush(task.heap, (*row.order(), n, row))
    task._send_due()
    assert sent == ["p0-before", "p1"] and [e[-1].uniq_key for e in task.behind[0]] == \
        ["p0-after", "p0-later"]
    task._send_due()
    assert sent == ["p0-before", "p1"], "still waiting"
    body = Row(1_000, 0, 50, 5, "t", None, None, b"v", [], 1, 0, "p0-reference")
    Bodies.wanted = {}
    heapq.heappush(task.heap, (*body.order(), 9, body))   # its body read: held like any
    task._send_due()
    assert sent == ["p0-before", "p1", "p0-reference", "p0-after", "p0-later"]
    assert task.behind == {}
    # Bodies come in offset order, not due order: one read while an earlier-due reference of
    # its partition still waits is set aside too, and goes back before what waits after it.
    sent.clear()
    Bodies.wanted = {0: (2_000, 0, 70)}
    late = Row(2_500, 0, 72, 6, "t", None, None, b"v", [], 1, 0, "due-2500")
    heapq.heappush(task.heap, (*late.order(), 10, late))
    task._send_due()
    early = Row(2_100, 0, 71, 7, "t", None, None, b"v", [], 1, 0, "due-2100")
    heapq.heappush(task.heap, (*early.order(), 11, early))
    task._send_due()
    assert sent == [] and len(task.behind[0]) == 2
    Bodies.wanted = {0: (2_200, 0, 73)}   # the first one read; a later one due 2,200 waits
    task._send_due()
    assert sent == ["due-2100"], "the earlier-due row back, the later one still aside"


@pytest.mark.parametrize("stopping", [False, True])
def test_a_timer_read_while_a_commit_awaits_its_acks_is_ringed_in_the_next_transaction(stopping):
    """While a commit waits for its acks the task reads the intake on (txn.py `_acks_awaited`):
    a timer it reads then for the ring is written after that commit, into the transaction it
    opens, never into the one being committed. A stopping task only waits."""
    from streaming.dispatch.task import _Task

    events = []

    class Committing:
        def __init__(self):
            self.unacked = 1

        def flush(self, timeout):
            events.append("flush")
            left, self.unacked = self.unacked, 0
            return left

        def commit_transaction(self, timeout):
            events.append("commit")

        def begin_transaction(self):
            events.append("begin")

    task = _Task.__new__(_Task)
    task.txn, task.partition, task.stopping, task.done = True, 0, stopping, {}
    task.committing, task.deferred, task.doomed, task.retry = False, [], None, []
    task.in_transaction, task.producer, task.sent, task.dead = True, Committing(), 0, 0
    task.config = SimpleNamespace(ack_check_s=60)
    task._release = task._ledger = lambda force=False: None
    task._now_ms = lambda: 0
    task.ring = SimpleNamespace(takes=lambda row, now: True, slot=lambda due: 0,
                                partition=lambda slot: 3, config=SimpleNamespace(topic="ring"),
                                dirty=set(), written={})
    task._produce = lambda topic, part, row, headers, report: events.append(row.uniq_key) or True
    timer = Row(60_000, 0, 7, 7, "real", None, b"k", b"v", [], -1, 0, "t1")
    task._consume = lambda wait_s, done: events.append("read") or task._ring_write(timer)
    task._commit_transaction()
    if stopping:
        assert events == ["flush", "flush", "commit", "begin"], "a stopping task reads nothing"
    else:
        assert events == ["flush", "read", "flush", "commit", "begin", "t1"]
        assert task.deferred == [] and task.ring.dirty == {3} and not task.committing


def _answering(answered: str, unacked: int):
    """A task whose look-ups the broker answers for its "consumer", "neither" or "both" clients,
    `unacked` records awaited, checked at once and given up after 0.2 s cut off."""
    from confluent_kafka import KafkaException

    from streaming.dispatch.task import _Task

    class Client:
        def __init__(self, answers):
            self.answers = answers

        def list_topics(self, topic, timeout):
            if not self.answers:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))
            return SimpleNamespace(topics={})

    task = _Task.__new__(_Task)
    task.partition, task.doomed, task.unacked = 0, None, Counter(real=unacked)
    task.producer = Client(answered.startswith("both"))
    task.consumer = Client(not answered.startswith("neither"))
    task.config = SimpleNamespace(ack_check_s=0.0, stall_s=0.2)
    task.ledger = SimpleNamespace(topic="ledger")
    return task


@pytest.mark.parametrize("answered", ["consumer", "neither", "both", "consumer, acks coming"])
def test_a_producer_the_broker_answers_no_more_while_it_answers_the_consumer_is_given_up(answered):
    """Records unacknowledged: a producer whose look-ups go unanswered while the task's consumer's
    are answered is given up after `stall_s` (Stalled: a new producer takes over); with neither
    answered (the broker away), both (a topic that takes no records yet), or acks still coming
    (a slow broker answers a producer's look-up after its records), the task waits on."""
    from streaming.dispatch.start import Stalled

    acks = answered.endswith("acks coming")
    task = _answering(answered, unacked=10**9 if acks else 1)
    task._ledger = lambda force=False: acks and task.unacked.subtract(real=1)   # one ack a turn
    task._held_up = lambda topics: None
    until = time.monotonic() + 1.0   # acknowledged after a second
    task._acks_awaited = lambda: time.monotonic() < until
    if answered == "consumer":
        with pytest.raises(Stalled, match="no answer from the broker for .* while its consumer"):
            task._await_acks()
        assert time.monotonic() < until - 0.5, "given up after stall_s, not at the ack"
    else:
        task._await_acks()
        assert time.monotonic() >= until


def test_a_ring_write_the_task_s_own_abort_purged_is_ringed_again_and_a_refused_one_held():
    """A ring write lost with its transaction is written again when its row is read again; one
    the broker refused is held in memory instead (`Refusals.unringed`); one the task's own abort
    or stall purged from its producer was refused by nobody and is written again too."""
    from streaming.dispatch.task import _Task
    from streaming.dispatch.txn import Refusals

    task = _Task.__new__(_Task)
    task.txn, task.refusals, task.doomed, task.partition = True, Refusals(), None, 0
    timer = Row(60_000, 0, 7, 7, "real", None, b"k", b"v", [], -1, 0, "t1")
    for purged in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
        task._ringed(KafkaError(purged), object(), timer, 0)
    assert task.refusals.unringed == set() and task.doomed
    task._ringed(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), object(), timer, 0)
    assert task.refusals.unringed == {(timer.source, timer.offset)}


@pytest.mark.parametrize("answered", ["consumer", "neither", "both", "consumer, acks coming"])
def test_at_least_once_a_producer_the_broker_answers_no_more_is_given_up_at_a_commit(answered):
    """at_least_once, where no commit awaits the acks: at each commit, records unacknowledged and
    no ledger record acknowledged since `ack_check_s`, a producer whose look-ups go unanswered
    while the consumer's are answered is given up after `stall_s` (Stalled); with neither
    answered (the broker away), both, or acks coming, the task goes on."""
    from streaming.dispatch.start import Stalled

    task = _answering(answered, unacked=1)
    task.ledger_end, task._watch = 0, (None, 0, time.monotonic())
    start = time.monotonic()
    with pytest.raises(Stalled) if answered == "consumer" else nullcontext():
        while time.monotonic() - start < 1.0:   # a commit every 20 ms
            task._watch_acks()
            task.ledger_end += answered.endswith("acks coming")
            time.sleep(0.02)
    assert answered != "consumer" or 0.2 <= time.monotonic() - start < 0.5


def test_at_least_once_what_its_stall_purged_is_left_to_the_next_task():
    """at_least_once: a send, dead letter, ring write or ledger record purged from the producer by
    the task's own stall is neither retried, nor held, nor dead-lettered: the next task, from the
    last commit, reads its row again."""
    from streaming.dispatch.task import _Task
    from streaming.dispatch.txn import Refusals

    class Producer:   # keeps each record's delivery report
        def produce(self, *args, on_delivery, **kwargs):
            reports.append(on_delivery)

    task = _Task.__new__(_Task)
    task.txn, task.refusals, task._refused, task.partition = False, Refusals(), set(), 0
    task.producer, task.unacked, task._now_ms = Producer(), Counter(), lambda: 0
    done, reports = [], []
    task._later = task._hold = task._dead_letter = lambda *args: done.append(args)
    timer = Row(60_000, 0, 7, 7, "real", None, b"k", b"v", [], -1, 0, "t1")
    for purged in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
        err = KafkaError(purged)
        for callback in (task._delivered, task._ringed,
                         lambda e, m, r, s: task._dead_lettered(e, r, s, "unknown_topic")):
            task._produce("real", None, timer, [], callback)
            reports.pop()(err, object())   # through the send's report, as librdkafka calls it
        task._ledgered(err, object(), [timer], object())
    assert done == [] and task.unacked == Counter(real=0)


@pytest.mark.parametrize("txn", [True, False])
def test_a_stalled_task_is_not_aborted_and_a_new_task_takes_over_from_its_last_commit(
        monkeypatch, txn):
    """run_partition: a Stalled task's producer is purged, never aborted (that call hung), its
    close waits 2 s at most for the purged records' reports, what it sent after its last commit
    does not count (exactly_once: at_least_once's acked sends were delivered), and a new task
    (exactly_once: its new producer fences the old one) goes on."""
    from streaming.dispatch import task as module
    from streaming.dispatch.start import Stalled

    calls, tasks = [], []

    class Producer:
        def purge(self, blocking=True):
            calls.append(("purge", blocking))

        def abort_transaction(self, timeout):
            calls.append("abort")

    class Task:
        def __init__(self, config, partition, clock, refusals):
            self.producer, self.stalled, self.skipped = Producer(), False, 0
            self.sent, self.dead, self.at_commit, self.txn = 7, 1, (3, 0), txn
            tasks.append(self)

        def run(self):
            if len(tasks) == 1:
                raise Stalled("its producer had no answer")

        def close(self):
            calls.append(("close", self.stalled))

    monkeypatch.setattr(module, "_Task", Task)
    done = list(module.run_partition(SimpleNamespace(retry_backoff_s=0.0, jvm_nice=0), 0))
    assert calls == [("purge", False), ("close", True), ("close", False)]
    sent, dead = (3, 0) if txn else (7, 1)
    assert len(tasks) == 2 and done == [{"partition": 0, "sent": sent + 7, "dead": dead + 1,
                                         "skipped": 0}]


def test_intake_records_due_soon_are_parsed_at_most_every_urgent_gather_s(monkeypatch):
    """A record that may be due soon has its records parsed sooner than `gather_s`, but no
    sooner than `urgent_gather_s` after the last parse: a parse costs about 1 ms however few
    its records, and at 5,000 timers/s parses at almost every turn of the loop took 43% of a
    task's samples. The others wait for `gather_s`."""
    import streaming.dispatch.reading as reading
    from streaming.dispatch.task import _Task

    class Intake:
        def __init__(self):
            self.records = []

        def consume(self, n, timeout):
            records, self.records = self.records, []
            return records

    class Record:
        def __init__(self, urgent):
            self.urgent = urgent

        def error(self):
            return None

        def topic(self):
            return "intake"

    now = [100.0]
    monkeypatch.setattr(reading.time, "monotonic", lambda: now[0])
    task = _Task.__new__(_Task)
    task.config = SimpleNamespace(read_batch=250, gather_s=1.0, urgent_gather_s=0.25)
    task.consumer, task.ready = Intake(), SimpleNamespace(topic="ready")
    task._gathered, task._gathered_since, task._urgent, task._parsed_at = [], 0.0, False, 0.0
    task._due_soon = lambda msg: msg.urgent
    parses = []
    task._take_intake = lambda msgs, done: parses.append(len(msgs))

    def turn(*urgent, after_s=0.0):
        now[0] += after_s
        task.consumer.records = [Record(u) for u in urgent]
        task._consume(0.0, {})
    turn(True)
    assert parses == [1], "the first one due soon is parsed at once"
    turn(False, True, after_s=0.0625)
    turn(False, after_s=0.0625)
    assert parses == [1], "another within urgent_gather_s waits"
    turn(after_s=0.125)
    assert parses == [1, 3], "then it is parsed, with the others read meanwhile"
    turn(False, after_s=0.5)
    turn(False, after_s=0.5)
    assert parses == [1, 3], "none due soon: they wait for gather_s"
    turn(after_s=0.5)
    assert parses == [1, 3, 2]
