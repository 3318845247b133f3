"""The delivery path first on its host: a dispatch task lowers the priority of the JVM its Python
worker serves, never its own. A due message then waits less for a CPU behind the wheel's
micro-batches, the ledger query and the JVM's compilers, whose work has the fire lead to spare."""
from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


def lower_jvm(nice: int) -> int:
    """Every thread of this worker's nearest `java` ancestor (its executor; in local mode, the
    driver too) at Linux nice `nice` at least; the threads the JVM starts later take their
    creator's. Raising a nice needs no privilege. Returns the JVM's pid (0: no JVM found, not
    Linux, or `nice` 0)."""
    if nice <= 0 or not os.path.isdir("/proc/self/task"):
        return 0
    pid = os.getppid()   # the PySpark daemon, or the JVM itself without one
    while pid > 1 and _comm(pid) != "java":
        pid = _parent(pid)
    if pid <= 1:
        log.warning("dispatch: no JVM above Python worker %d; its priority is left as it is",
                    os.getpid())
        return 0
    for _ in range(2):   # and the threads started during the first pass
        for tid in map(int, os.listdir(f"/proc/{pid}/task")):
            with contextlib.suppress(OSError):   # ended meanwhile
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
    return pid


def _comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    return ""


def _parent(pid: int) -> int:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:   # the command may hold spaces and parentheses
            return int(f.read().rsplit(")", 1)[1].split()[1])
    return 0
