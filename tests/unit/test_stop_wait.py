"""`wait_for_the_stop` (streaming/wheel/query.py) over a stand-in of the JVM's Thread (the real
one runs in tests/integration/test_delivery.py's stop tests): a batch begun after the stop was asked waits
in slices, ends at the stop's interruption, and interrupts itself when that interruption never
reached it."""
import pytest

from state.errors import JobError
from streaming.wheel import writer as J
class Interrupted(Exception):
    pass


class Thread:
    """java.lang.Thread as the wait uses it: sleep advances the clock and raises once the
    thread is interrupted (clearing the flag, as the JVM does)."""

    def __init__(self, clock, interrupt_at=None):
        self.clock, self.interrupt_at, self.flag, self.self_interrupts = clock, interrupt_at, False, 0

    def currentThread(self):
        return self

    def interrupt(self):
        self.flag = True
        self.self_interrupts += 1

    def sleep(self, ms):
        if self.interrupt_at is not None and self.clock.now >= self.interrupt_at:
            self.flag, self.interrupt_at = True, None   # the stop's own interruption
        if self.flag:
            self.flag = False
            raise Interrupted()
        self.clock.now += ms / 1000


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


class Spark:
    def __init__(self, thread):
        self._jvm = type("JVM", (), {"java": type("java", (), {"lang": type("lang", (), {
            "Thread": thread})})})


def test_the_stops_interruption_ends_the_wait_as_a_stop():
    clock = Clock()
    thread = Thread(clock, interrupt_at=103.0)
    with pytest.raises(Interrupted) as raised:
        J.wait_for_the_stop(Spark(thread), 7, lambda: 102.9, clock)
    assert raised.value.delayq_stop and thread.self_interrupts == 0
    assert clock.now == pytest.approx(103.0)


def test_a_lost_interruption_is_made_up_once_the_stop_is_under_way():
    clock = Clock()
    thread = Thread(clock)           # the stop's interruption never reaches the wait
    asked = 101.0
    with pytest.raises(Interrupted) as raised:
        J.wait_for_the_stop(Spark(thread), 7, lambda: asked, clock)
    assert raised.value.delayq_stop and thread.self_interrupts == 1
    assert asked + J.STOP_INTERRUPT_AFTER_S <= clock.now <= asked + J.STOP_INTERRUPT_AFTER_S + \
        J.STOP_SLICE_MS / 1000


def test_without_a_stop_the_wait_ends_in_an_error_and_never_interrupts_itself():
    clock = Clock()
    thread = Thread(clock)
    with pytest.raises(JobError, match="batch 7 waited 600 s"):
        J.wait_for_the_stop(Spark(thread), 7, lambda: None, clock)
    assert thread.self_interrupts == 0 and clock.now == pytest.approx(100.0 + 600)


def _ledger_writer(fail):
    from streaming.ledger.query import LedgerWriter
    import threading

    writer = LedgerWriter.__new__(LedgerWriter)
    writer.stopping, writer.idle = False, threading.Event()
    writer.idle.set()

    def write(batch, batch_id):
        assert not writer.idle.is_set()   # a batch under way: the stop waits for it
        raise fail
    writer._write = write
    return writer


@pytest.mark.parametrize("stopping", [False, True])
def test_a_ledger_batch_interrupted_by_the_stop_is_not_logged_as_an_error(stopping):
    import logging

    writer = _ledger_writer(Interrupted("interrupted"))
    if stopping:
        writer.finish(grace_s=0)   # as DelayJob.stop does before the ledger query's stop
    with pytest.raises(Interrupted) as raised:
        writer(None, 7)
    assert writer.idle.is_set()
    record = logging.LogRecord("py4j.clientserver", logging.ERROR, __file__, 1, "boom", None,
                               (Interrupted, raised.value, None))
    assert J._QuietStop().filter(record) is (not stopping)
