"""A Python worker settles its collector at its first task (state/worker.py), and every
function the job hands to a worker settles it."""
from __future__ import annotations

import pytest

import state.parse
import state.wheel
from state.parse import make_parser
from tests.support import fresh_python
from tests.unit.test_wheel import NOW, RULES, envelopes, intake, run, state as group

PROBE = """
import gc
from state.worker import settle
settle()
first = gc.get_freeze_count()
kept = [[i] for i in range(10_000)]   # new objects, made after the first task began
settle()
print(first, gc.get_freeze_count())
"""


def _freeze_counts(env: dict) -> tuple[int, int]:
    out = fresh_python(PROBE, env).split()
    return int(out[0]), int(out[1])


def test_a_reused_worker_freezes_what_it_holds_once():
    first, again = _freeze_counts({"SPARK_REUSE_WORKER": "1", "PATH": ""})
    assert first > 1_000        # the interpreter's and the imported modules' objects
    assert again == first       # what later tasks make is left to the collector


def test_outside_a_reused_worker_nothing_is_frozen():
    assert _freeze_counts({"PATH": ""}) == (0, 0)


@pytest.fixture
def settles(monkeypatch):
    calls = []
    for module in (state.parse, state.wheel):
        monkeypatch.setattr(module, "settle", lambda name=module.__name__: calls.append(name))
    return calls


def test_the_parse_and_the_wheel_each_settle_their_worker(settles):
    batch = intake(([("REAL_TOPIC", b"t"), ("DELAY", b"1")], 0))
    assert list(make_parser(RULES, 1_000, 2, -1)(iter([batch])))
    run(envelopes(([("REAL_TOPIC", b"t"), ("DELAY", b"1")], 0)), group(NOW))
    assert settles == ["state.parse", "state.wheel"]


TASK_PROBE = """
import gc, weakref
from state import worker

class Held:
    pass

worker.run_one_task()
held = [[i] for i in range(10_000)]
worker.freeze_held()   # the first turn
first = gc.get_freeze_count()
newer = [[i] for i in range(10_000)]
worker.freeze_held()   # within the second: nothing more
again = gc.get_freeze_count()
ring = Held()
ring.me = ring   # a cycle the run held when it ended
gone = weakref.ref(ring)
del ring
worker._frozen_at = 0.0   # a second later
worker.freeze_held()
gc.collect()
kept = gone() is not None
worker.thaw()   # the run ends
print(first, again, gc.get_freeze_count(), kept, gone() is None)
"""


def test_a_dispatch_task_s_worker_freezes_what_it_holds_and_thaws_all_of_it_between_runs():
    """The held rows, frozen once a second, are walked by no collection; a cycle frozen with
    them outlives every collection until the run ends, when all of it is the collector's again."""
    first, again, after, kept, freed = fresh_python(TASK_PROBE).split()
    assert int(first) > 10_000 and int(again) == int(first)
    assert int(after) == 0
    assert (kept, freed) == ("True", "True")
