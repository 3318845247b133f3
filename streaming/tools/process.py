"""Background JVM processes the CLI starts and stops (the local broker, the local Spark
cluster): pid files, liveness, a stop that escalates from SIGTERM to SIGKILL."""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from streaming.kafka.admin import port_open  # noqa: F401  (the tests and tools take it from here)
from streaming.spark.supervise import children  # noqa: F401  (the tests and tools take it from here)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def read_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (tests start it so)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def terminate(pid_file: Path, timeout_s: float) -> bool:
    """SIGTERM the process of `pid_file`, SIGKILL after timeout_s; False if none ran."""
    pid = read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        reap(pid)
        time.sleep(0.2)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            reap(pid)
            time.sleep(0.1)
    reap(pid)
    pid_file.unlink(missing_ok=True)
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (all held open while choosing: two separate
    calls may return the same port)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _live_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def session_pids(sid: int) -> list[int]:
    """Every live process whose session is `sid` (Linux /proc)."""
    pids = []
    for pid in _live_pids():
        try:
            if os.getsid(pid) == sid:
                pids.append(pid)
        except OSError:
            pass
    return pids


def kill_session(proc, timeout_s: float = 30) -> None:
    """SIGKILL every process of `proc`'s session (`proc`, a Popen, started with
    start_new_session=True), as a lost host would, and return once all are gone. Waiting
    for `proc` alone is not enough: a delayq job's Spark JVM exits only when its driver's
    pipe closes, a moment later, and a write it had under way can still land."""
    members = session_pids(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout_s)
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(pid) for pid in members) and time.monotonic() < deadline:
        time.sleep(0.05)
