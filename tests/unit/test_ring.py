"""A dispatch task's ring (streaming/dispatch/ring.py) without Kafka: which partition a timer's
slot lives in, which timers go to the ring, when they are written, which slot is read next, how far
a slot is read, and a ring record read back as the row it was written from."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from streaming.dispatch import ring as ring_module
from streaming.dispatch.ring import FILL, RING, Ring, RingConfig, ring_row, ring_value
from streaming.dispatch.rules import Row

CONFIG = RingConfig("in.TIMERS", slots=6, slot_ms=2_000, lead_ms=1_000)


class Record:
    """What confluent-kafka's consumer hands over, for `ring_row`."""

    def __init__(self, row: Row, offset: int, partition: int):
        self._row, self._offset, self._partition = row, offset, partition

    def headers(self):
        return [*self._row.headers, (RING, ring_value(self._row))]

    def topic(self):
        return CONFIG.topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def error(self):
        return None

    def key(self):
        return self._row.key

    def value(self):
        return self._row.value


class Filler(Record):
    """A filler (txn.py `_commit_hanging`): no timer, its only header FILL."""

    def __init__(self, offset: int, partition: int):
        self._offset, self._partition = offset, partition

    def headers(self):
        return [FILL]


class End:
    """A consumer's report at a partition's end (`error` names it), or another error."""

    def __init__(self, offset: int, code=KafkaError._PARTITION_EOF):
        self._offset, self._error = offset, KafkaError(code)

    def offset(self):
        return self._offset

    def error(self):
        return self._error


class Consumer:
    """Hands over a scripted list of messages at each consume."""

    def __init__(self, *batches):
        self.batches = list(batches)

    def consume(self, n, timeout):
        return self.batches.pop(0) if self.batches else []

    def assign(self, parts):
        pass

    def unassign(self):
        pass


def ring(task: int = 1) -> Ring:
    ring = Ring.__new__(Ring)   # no consumer: the rules only
    ring.config, ring.task, ring.ends, ring.reading, ring.dirty = CONFIG, task, {}, None, set()
    ring.unread = {}
    ring.written, ring.until, ring.read_to, ring.seen = {}, 0, None, set()
    ring.short_since, ring.gathered, ring.gathered_at = None, [], 0.0
    ring.held_instead, ring.first_turn_until, ring.read_batch = set(), 0, 250
    return ring


def timer(due: int, qid: int | None = 3) -> Row:
    headers = [("trace", b"t"), ("UNIQ_KEY", b"u1"), ("DELIVER_MS", str(due).encode())]
    return Row(due, 4, 77, 77, "orders", qid, b"k", b"v", headers, -1, due - 5_000, "u1",
               source=("in", 4))


def test_a_task_owns_its_slots_partitions_and_a_slot_maps_to_one_by_its_due_time():
    r = ring(task=1)
    assert r.partitions() == [6, 7, 8, 9, 10, 11]
    assert [r.partition(r.slot(due)) for due in (0, 1_999, 2_000, 11_999, 12_000)] == \
        [6, 6, 7, 11, 6]


def test_a_timer_goes_to_the_ring_only_into_a_slot_not_read_yet_and_not_due_within_the_lead():
    r = ring()
    r.start(now_ms=100_000, positions={})
    assert r.next_slot == 50 - 6 + 1, "a turn back: every partition is read once more"
    r.next_slot = 51   # slot 50 (100.0-102.0 s) read
    assert not r.takes(timer(101_500), now_ms=100_000), "its slot was read: held"
    assert not r.takes(timer(102_500), now_ms=101_600), "due within the read lead: held"
    assert r.takes(timer(104_000), now_ms=100_000)
    r.written[r.partition(52)] = 58   # a row of the slot a turn later is there already
    assert not r.takes(timer(104_000), now_ms=100_000), "never behind a later turn's row"


def test_timers_for_the_ring_are_written_together_after_the_first_waited_and_a_late_slot_s_held(
        monkeypatch):
    """Timers read for the ring are gathered and written together `write_ms` after the first was
    read (each transaction writing a ring partition marks it: conf's ring_write_ms); one whose
    slot was read meanwhile is held by the task instead."""
    from streaming.dispatch import ringing

    now = [100.0]
    monkeypatch.setattr(ringing.time, "monotonic", lambda: now[0])
    task = ringing.Ringing()
    task.ring, task.committing, written, held = ring(), False, [], []
    task.ring.config = RingConfig("in.TIMERS", slots=6, slot_ms=2_000, lead_ms=1_000,
                                  write_ms=1_000)
    task.ring.next_slot = 51   # slot 51 (102.0-104.0 s) is the next read
    task._now_ms = lambda: int(now[0] * 1000)
    task._produce = lambda topic, part, row, headers, report: written.append((part, row)) or True
    task._hold = held.append
    soon, later = timer(105_500), timer(111_000)   # slots 52 and 55
    task._ring_take(soon)
    now[0] += 0.5
    task._ring_take(later)
    now[0] += 0.499
    task._ring_write_gathered()
    assert written == [] and held == [], "the first waited less than write_ms"
    now[0] += 0.001
    task._ring_write_gathered()
    assert written == [(task.ring.partition(52), soon), (task.ring.partition(55), later)]
    assert task.ring.gathered == [] and task.ring.dirty == {6 + 4, 6 + 1}
    written.clear()
    task._ring_take(soon)
    task.ring.next_slot = 53   # slot 52 read while it was gathered
    now[0] += 1
    task._ring_write_gathered()
    assert written == [] and held == [soon]
    overdue = timer(int(now[0] * 1000) - 1_000)   # read late, after an outage
    task._ring_take(overdue)
    assert held == [soon, overdue] and task.ring.gathered == [], "held at once, not gathered"


def test_the_next_slot_opens_its_lead_before_it_starts_and_an_empty_one_is_passed():
    r = ring()
    r.next_slot = 51
    assert r.due_to_open(now_ms=100_999) is None
    assert r.due_to_open(now_ms=101_000) == 51
    r.open(51, position=0)   # its partition's end is 0 as far as the task knows: nothing there
    assert r.next_slot == 52 and r.reading is None


def test_a_slot_holding_a_burst_opens_earlier_by_its_records():
    r = ring()
    r.config = RingConfig("in.TIMERS", slots=6, slot_ms=2_000, lead_ms=1_000,
                          lead_per_message_us=80)
    r.next_slot = 51   # starts at 102,000: read from 101,000, and 8 s earlier for 100,000 rows
    assert r.due_to_open(now_ms=100_999, unread=0) is None
    assert r.due_to_open(now_ms=92_999, unread=100_000) is None
    assert r.due_to_open(now_ms=93_000, unread=100_000) == 51


def test_a_ring_record_reads_back_as_the_row_written_its_source_the_ring():
    for qid in (3, None):
        row = timer(123_456, qid)
        back = ring_row(Record(row, offset=9, partition=7))
        assert (back.due_ms, back.ipart, back.ioff, back.offset, back.topic, back.partition,
                back.key, back.value, back.headers, back.level, back.append_ms,
                back.uniq_key, back.source) == (
            row.due_ms, 4, 77, 9, "orders", qid, b"k", b"v", row.headers, -1, row.append_ms,
            "u1", ("in.TIMERS", 7))


def test_a_slot_is_read_past_what_the_task_committed_there_and_its_markers():
    """A commit returns before its markers are written: a read_committed read may end short of
    it, and the slot is not read until it ends at or past the end the task knows. Its timers
    count as unread until read (the pending gauge), the markers never."""
    r = ring()
    part = r.partition(51)
    r.next_slot, r.ends[part], r.unread[part] = 51, 3, 3
    rows = [Record(timer(102_100 + i), offset=i, partition=part) for i in range(3)]
    r.consumer = Consumer([rows[0], End(1)], [], [*rows[1:], End(4)])   # [] : nothing fetched
    r.open(51, position=0)
    assert len(r.pump(100)) == 1 and r.reading is not None, "ended short: still reading"
    assert r.unread[part] == 2
    assert len(r.pump(100)) == 2 and r.reading is None and r.next_slot == 52
    assert r.read_to == 4, "the position past the commit marker"
    assert r.unread[part] == 0


def test_a_later_turns_row_ends_a_slots_read_and_a_lost_position_stops_the_task():
    r = ring()
    r.next_slot, r.ends[r.partition(51)] = 51, 5
    later = Record(timer(102_100 + 12_000), offset=1, partition=r.partition(51))
    r.consumer = Consumer([Record(timer(102_100), offset=0, partition=r.partition(51)), later])
    r.open(51, position=0)
    assert len(r.pump(100)) == 1 and r.reading is None and r.read_to is None
    r.consumer = Consumer([End(0, KafkaError._AUTO_OFFSET_RESET)])
    r.ends[r.partition(52)] = 5
    r.open(52, position=0)
    with pytest.raises(RuntimeError, match="ring read of partition"):
        r.pump(100)


def test_a_read_short_of_the_tasks_commit_for_the_markers_wait_is_hanging_and_a_filler_is_skipped(
        monkeypatch):
    """The broker lost a commit's markers: the slot's read ends short of what the task committed
    there. After `markers_wait_ms` the partition is named (the task writes a filler there, whose
    commit commits the hanging records); the read then passes them and skips the filler."""
    now = [100.0]
    monkeypatch.setattr(ring_module.time, "monotonic", lambda: now[0])
    r = ring()
    part = r.partition(51)
    r.next_slot, r.ends[part] = 51, 1
    hung = Record(timer(102_100), offset=0, partition=part)
    r.consumer = Consumer([End(0)], [], [], [], [hung, Filler(1, part), End(3)])
    r.open(51, position=0)
    assert r.pump(100) == [] and r.hanging() is None, "markers may still come"
    now[0] += 4.9
    assert r.pump(100) == [] and r.hanging() is None
    now[0] += 0.1
    assert r.pump(100) == [] and r.hanging() == part
    rows = r.pump(100)   # the filler committed: the hanging record, then the filler, then the end
    assert [row.uniq_key for row in rows] == [hung._row.uniq_key] and r.read_to == 3
    assert r.reading is None and r.next_slot == 52 and r.hanging() is None
    # Ended short, then past the end with no record between (an aborted batch skipped): read,
    # and no longer waited for.
    r.ends[r.partition(52)] = 2
    r.consumer = Consumer([End(0)], [], [End(3)])
    r.open(52, position=0)
    assert r.pump(100) == [] and r.pump(100) == [] and r.reading is None
    now[0] += 10
    assert r.hanging() is None
