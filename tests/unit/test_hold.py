import pyarrow as pa

from state.hold import hold_until_due
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


def test_empty_input_yields_nothing():
    assert list(hold_until_due(iter([]))) == []


def test_time_rules():
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_200, delay_ms=1_000) == 100
    assert correct_deliver_timestamp(now_ms=100, due_ms=1_100, delay_ms=1_000) == 1_100
    assert slot_of(2_999, 1_000) == 2
    assert fire_horizon(5_000, 700) == 5_700
    assert timer_for(10_000, 2_000, watermark_ms=1_000) == 8_000
    assert timer_for(10_000, 2_000, watermark_ms=9_000) == 9_001
