import pyarrow as pa

from state.hold import by_due, hold_until_due
from state.timing import correct_deliver_timestamp, fire_horizon, slot_of, timer_for


class FakeClock:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self, start_ms):
        self.ms = start_ms
        self.sleeps = []

    def now(self):
        return self.ms / 1000

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.ms += int(round(seconds * 1000))


def test_rows_leave_in_due_order_and_never_before_due():
    clock = FakeClock(1_000)
    rows = pa.record_batch({"due_ms": pa.array([1_500, 0, 1_000, 1_200, 1_200], pa.int64()),
                            "id": list("abcde")})
    released = []
    for chunk in hold_until_due(iter([rows.slice(0, 2), rows.slice(2)]),
                                clock=clock.now, sleep=clock.sleep):
        for row in chunk.to_pylist():
            assert row["due_ms"] <= clock.ms, "released before due"
            released.append((row["id"], clock.ms))
    assert [r[0] for r in released] == ["b", "c", "d", "e", "a"]
    assert dict(released) == {"b": 1_000, "c": 1_000, "d": 1_200, "e": 1_200, "a": 1_500}


def test_what_was_released_is_flushed_before_each_wait():
    """Rows released before a wait must leave before it: the hold flushes the worker's output
    (sinks/kafka.py worker_output_flush) each time it is about to sleep, and only then."""
    clock = FakeClock(1_000)
    rows = pa.record_batch({"due_ms": pa.array([900, 1_000, 1_300, 1_300, 2_000], pa.int64())})
    events = []
    for chunk in hold_until_due(iter([rows]), clock=clock.now,
                                sleep=lambda s: (events.append("sleep"), clock.sleep(s)),
                                flush=lambda: events.append("flush")):
        events.append(chunk.num_rows)
    assert events == [2, "flush", "sleep", 2, "flush", "sleep", 1]


def test_nothing_is_flushed_while_nothing_was_released():
    clock = FakeClock(1_000)
    flushes = []
    rows = pa.record_batch({"due_ms": pa.array([1_500], pa.int64())})
    assert [c.num_rows for c in hold_until_due(iter([rows]), clock=clock.now, sleep=clock.sleep,
                                               flush=lambda: flushes.append(1))] == [1]
    assert flushes == []


def test_by_due_sorts_only_what_is_out_of_order():
    """Rows in due order already (a burst due at one moment) come back as they are, their
    payloads not copied; others sorted, equal due times in their order of arrival."""
    ordered = [pa.record_batch({"due_ms": pa.array(d, pa.int64()), "value": [b"x" * 64] * len(d)})
               for d in ([5, 5, 5], [5, 7], [9])]
    rows = by_due(iter(ordered))
    assert rows.column("due_ms").to_pylist() == [5, 5, 5, 5, 7, 9]
    assert rows.column("value").chunk(0).buffers()[2].address == \
        ordered[0].column("value").buffers()[2].address, "not copied"
    mixed = [pa.record_batch({"due_ms": pa.array([5, 9], pa.int64()), "id": ["a", "b"]}),
             pa.record_batch({"due_ms": pa.array([7, 5], pa.int64()), "id": ["c", "d"]})]
    rows = by_due(iter(mixed))
    assert rows.column("id").to_pylist() == ["a", "d", "c", "b"]


def test_empty_input_yields_nothing():
    assert list(hold_until_due(iter([]))) == []


def test_time_rules():
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_200, delay_ms=1_000) == 100
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_100, delay_ms=1_000) == 1_100
    assert slot_of(2_999, 1_000) == 2
    assert fire_horizon(5_000, 700) == 5_700
    assert timer_for(10_000, 2_000, watermark_ms=1_000) == 8_000
    assert timer_for(10_000, 2_000, watermark_ms=9_000) == 9_001
