"""Settles a worker's cyclic GC once per process: a reused PySpark worker runs a full
`gc.collect()` after each task; freezing what it holds at its first task leaves later collections
only newer objects (frozen ones are still freed by refcount; only their cycles are never freed)."""
from __future__ import annotations

import gc
import os

_settled = False


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
