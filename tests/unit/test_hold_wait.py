"""A batch waits for the driver's hold when it is far behind (streaming/job.py
`wait_for_the_hold`, sinks/driver_hold.py `DriverHold.overdue`): no JVM, no broker (the hold's
producer is built but never sends)."""
import pyarrow as pa

from sinks.driver_hold import SPOOLED, DriverHold
from state.columns import OUTPUT
from streaming.job import wait_for_the_hold


def spooled(dues: list[int]) -> pa.Table:
    n = len(dues)
    columns = {"topic": ["t"] * n, "partition": [0] * n, "key": [None] * n,
               "value": [b"v"] * n, "headers": [[]] * n, "kind": ["deliver"] * n,
               "uniq_key": [f"u-{i}" for i in range(n)], "level": [1] * n, "ipart": [0] * n,
               "ioff": list(range(n)), "append_ms": [0] * n, "due_ms": dues}
    return pa.table({name: pa.array(columns[name], OUTPUT.field(name).type) for name in SPOOLED})


def test_overdue_counts_the_rows_due_and_not_yet_handed_over_across_files(tmp_path):
    now = [10.0]
    hold = DriverHold(tmp_path, {"bootstrap.servers": "127.0.0.1:9"}, clock=lambda: now[0])
    try:
        hold.put(1, 0, spooled([9_000, 10_000, 12_000]))
        hold.put(2, 0, spooled([9_500, 11_000]))
        assert hold.overdue() == 3
        now[0] = 11.0
        assert hold.overdue() == 4
        with hold._wake:       # what the sending thread records as it hands rows over
            next(iter(hold._files.values())).next = 2
        assert hold.overdue() == 2
    finally:
        hold.stop()


class Behind:
    """A hold whose backlog the sending thread works off by `step` rows per look."""

    def __init__(self, rows: int, step: int):
        self.rows, self.step, self.looks = rows, step, 0

    def overdue(self) -> int:
        self.looks += 1
        left, self.rows = self.rows, max(0, self.rows - self.step)
        return left


class Clock:
    def __init__(self):
        self.s = 0.0

    def __call__(self) -> float:
        return self.s

    def sleep(self, seconds: float) -> None:
        self.s += seconds


def test_a_batch_waits_until_the_hold_is_within_the_limit():
    clock = Clock()
    waited = wait_for_the_hold(Behind(100_000, 10_000), lambda: False, limit_rows=20_000,
                               timeout_s=15, sleep=clock.sleep, clock=clock)
    assert abs(waited - 0.4) < 1e-9, "100,000 → 20,000 in nine looks, eight waits of 50 ms"


def test_a_batch_waits_at_most_the_timeout_and_not_at_all_when_the_hold_keeps_up():
    clock = Clock()
    stuck = Behind(100_000, 0)
    assert wait_for_the_hold(stuck, lambda: False, limit_rows=20_000, timeout_s=2,
                             sleep=clock.sleep, clock=clock) == clock.s
    assert 2.0 <= clock.s < 2.1
    clock = Clock()
    assert wait_for_the_hold(Behind(20_000, 0), lambda: False, limit_rows=20_000,
                             sleep=clock.sleep, clock=clock) == 0.0


def test_a_stop_ends_the_wait():
    clock = Clock()
    looks = []
    closed = lambda: len(looks) > 3     # noqa: E731
    hold = Behind(100_000, 0)
    hold.overdue = lambda: looks.append(1) or 100_000
    wait_for_the_hold(hold, closed, limit_rows=20_000, timeout_s=15, sleep=clock.sleep,
                      clock=clock)
    assert len(looks) == 4 and clock.s < 0.2
