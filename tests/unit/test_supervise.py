"""streaming.spark.supervise: the Python driver found among spark-submit's children (Linux /proc), and
a stop passed on to it alone, a second one to spark-submit itself."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streaming.tools.process import children
from streaming.spark.supervise import DRIVER_FILE, driver_of


def test_the_driver_is_the_child_running_the_main_file_not_a_worker():
    wait = "import sys; sys.stdin.read()"
    worker = subprocess.Popen([sys.executable, "-c", wait, "-m", "pyspark.daemon"],
                              stdin=subprocess.PIPE)
    driver = subprocess.Popen([sys.executable, "-c", wait, f"/opt/delayq/{DRIVER_FILE}"],
                              stdin=subprocess.PIPE)
    try:
        # Under a loaded machine a child may show in /proc a moment before its command line
        # does: look until a deadline, and say what was seen when it is not found.
        deadline, found = time.monotonic() + 20, None
        while time.monotonic() < deadline and found is None:
            found = driver_of(os.getpid())
            time.sleep(0.05 if found is None else 0)
        assert {worker.pid, driver.pid} <= set(children(os.getpid()))
        assert found == driver.pid, _seen(worker, driver)
        assert driver_of(worker.pid) is None
    finally:
        for proc in (worker, driver):
            proc.communicate(b"")


def _seen(*procs: subprocess.Popen) -> str:
    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError as error:
            return str(error).encode()
    return "; ".join(f"pid {p.pid} exit {p.poll()} cmdline {cmdline(p.pid)!r}" for p in procs)


# spark-submit's stand-in: a parent that starts a "driver" (argv ending in the main file) and
# waits for it; each records the signal it got in a file, and says when it can (a signal that
# comes before the handler is set kills the process without a record).
RECORD = """import signal, sys, time
def got(signum, frame):
    open(sys.argv[1], "w").write(signal.Signals(signum).name); sys.exit(0)
signal.signal(signal.SIGTERM, got)
open(sys.argv[1] + ".ready", "w").close()
"""
PARENT = RECORD + """import subprocess
subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[2], "/opt/delayq/%s"])
while True: time.sleep(0.05)
""" % DRIVER_FILE
CHILD = RECORD + "while True: time.sleep(0.05)\n"


def test_a_stop_goes_to_the_driver_alone_and_a_second_one_to_spark_submit(tmp_path):
    parent, child = tmp_path / "parent", tmp_path / "child"
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "streaming.spark.supervise", sys.executable, "-c", PARENT,
         str(parent), str(child), CHILD], cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                any(driver_of(p) for p in children(supervisor.pid))
                and Path(f"{child}.ready").exists() and Path(f"{parent}.ready").exists()):
            time.sleep(0.05)
        supervisor.send_signal(signal.SIGTERM)
        while time.monotonic() < deadline and not child.exists():
            time.sleep(0.05)
        assert child.read_text() == "SIGTERM" and not parent.exists()
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0, "spark-submit's exit code, passed on"
        assert parent.read_text() == "SIGTERM"
        assert "stopping the driver" in supervisor.stderr.read()
    finally:
        supervisor.kill()
