"""A Python worker's cyclic garbage collector, settled once per worker process.

PySpark reuses a worker process for task after task and runs a full `gc.collect()` after each
(`pyspark/daemon.py`, when SPARK_REUSE_WORKER is set), which walks every object the process
tracks, pandas', pyarrow's, numpy's and PySpark's included: every task cost a core that long
however few its rows. Freezing what the worker holds at its first task (the modules and their
tables, which live as long as the process) leaves the later collections only the objects made
since. Frozen objects are still freed by reference counting; only a reference cycle among them
is never collected, and they were made once.
"""
from __future__ import annotations

import gc
import os

_settled = False


def settle() -> None:
    """Collect once and freeze the objects this process holds, the first time it is called in a
    reused PySpark worker; elsewhere (the driver, a test) nothing. Each function the job hands
    to a worker (the parse and the wheel) calls it."""
    global _settled
    if _settled:
        return
    _settled = True
    if os.environ.get("SPARK_REUSE_WORKER"):
        gc.collect()
        gc.freeze()
