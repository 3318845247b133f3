"""`python -m streaming.spark.supervise <spark-submit …>`: a signal to the JVM would stop the
query mid-batch (resent after restart), so SIGTERM/SIGINT go to the driver's clean stop instead."""
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
    """The JVM's child running the main file (not a Python worker of local mode)."""
    for pid in children(jvm):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").endswith(DRIVER_FILE) for arg in args):
            return pid
    return None


def run(command: list[str], env: dict[str, str] | None = None) -> int:
    """spark-submit's exit code. It runs in its own session (out of Ctrl-C's reach), dies with
    this process; a second signal, or one before the driver starts, goes to the JVM."""
    proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    asked = []

    def forward(signum, frame) -> None:
        driver = driver_of(proc.pid) if not asked else None
        asked.append(signum)
        what = ("the driver (its batch under way finishes first); a second signal stops at once"
                if driver else "spark-submit")
        print(f"delayq: {signal.Signals(signum).name}: stopping {what}", file=sys.stderr,
              flush=True)
        try:
            os.kill(driver or proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
