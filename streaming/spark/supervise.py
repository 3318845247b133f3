"""spark-submit under a parent that turns a stop into the driver's clean stop.

    python -m streaming.spark.supervise <spark-submit command…>

Under spark-submit the Spark JVM is the parent of the Python driver, and a signal reaching
that JVM stops the query mid-batch: the batch runs again after the restart, sending it again.
So spark-submit runs here as a child, in a session of its own (out of a terminal's Ctrl-C's
reach) and killed if this process dies; a SIGTERM or SIGINT here goes on as SIGTERM to the
Python driver alone, whose clean stop (streaming/job.py) ends the JVM. Before the driver has
started, and on a second signal, the JVM gets it instead. `delayq submit` and
deploy/docker/entrypoint.sh run spark-submit this way.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

DRIVER_FILE = "deploy/spark/main.py"
PR_SET_PDEATHSIG = 1


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (Linux /proc)."""
    found = []
    for child in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            with open(f"/proc/{child}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        # pid (comm) state ppid …: comm may hold spaces and parentheses.
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(child)
    return found


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def driver_of(jvm: int) -> int | None:
    """The Python driver spark-submit's JVM started: its child running the main file (not
    one of the Python workers it also starts in local mode)."""
    for pid in children(jvm):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").endswith(DRIVER_FILE) for arg in args):
            return pid
    return None


def run(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run `command` (spark-submit) and return its exit code, passing stops on as above."""
    proc = subprocess.Popen(command, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent)
    asked = []

    def forward(signum, frame) -> None:
        driver = driver_of(proc.pid) if not asked else None
        asked.append(signum)
        what = ("the driver (its batch under way finishes first); a second signal stops at once"
                if driver else "spark-submit")
        print(f"delayq: {signal.Signals(signum).name}: stopping {what}", file=sys.stderr, flush=True)
        try:
            os.kill(driver or proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
