"""A Python worker's cyclic GC. A reused PySpark worker runs a full `gc.collect()` after each
task: freezing what it holds at its first task leaves later collections only newer objects
(frozen ones are still freed by refcount; only their cycles are never freed). A dispatch task
runs for its worker's whole life, its own way."""
from __future__ import annotations

import gc
import os
import time

# A dispatch task's worker collects cycles after this many allocations (default 700 took a third
# of the CPU: 200,000 references in bench_readback.py, 73 µs a message against 41).
TASK_GC_THRESHOLD = (50_000, 20, 100)
# And freezes what its task has held this long: the held rows form no cycles and each is freed by
# refcount once sent, and the collector's passes walk only what is newer. Unfrozen, they were
# walked again at every pass: at 5,000 timers/s a task paused 0.6-1.3 s in all, up to 273 ms at
# once, and past timers' p99 was 315-596 ms; frozen, 0.35-0.62 s, up to 185 ms, and 225-396 ms
# (four alternated pairs, docs/performance.md). At each task's end none of it was garbage.
TASK_FREEZE_S = 1.0

_settled = False
_frozen_at = 0.0


def settle() -> None:
    """Collect once and freeze what this process holds, on the first call in a reused PySpark
    worker; elsewhere (the driver, a test) nothing. The parse and the wheel call it."""
    global _settled
    if _settled:
        return
    _settled = True
    if os.environ.get("SPARK_REUSE_WORKER"):
        gc.collect()
        gc.freeze()


def run_one_task() -> None:
    """This worker runs one dispatch task, for its whole life (its restarts included)."""
    gc.set_threshold(*TASK_GC_THRESHOLD)


def freeze_held() -> None:
    """What the dispatch task holds, frozen at most every `TASK_FREEZE_S`."""
    global _frozen_at
    if time.monotonic() - _frozen_at >= TASK_FREEZE_S:
        gc.freeze()
        _frozen_at = time.monotonic()


def thaw() -> None:
    """Everything frozen back to the collector, and collected: after each run of a task (its
    worker may run another), so nothing a run held outlives it, its cycles included."""
    gc.unfreeze()
    gc.collect()
