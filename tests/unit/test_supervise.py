"""streaming.supervise finds the Python driver among spark-submit's children (Linux /proc)."""
from __future__ import annotations

import os
import subprocess
import sys

from streaming.supervise import DRIVER_FILE, children, driver_of


def test_the_driver_is_the_child_running_the_main_file_not_a_worker():
    wait = "import sys; sys.stdin.read()"
    worker = subprocess.Popen([sys.executable, "-c", wait, "-m", "pyspark.daemon"],
                              stdin=subprocess.PIPE)
    driver = subprocess.Popen([sys.executable, "-c", wait, f"/opt/delayq/{DRIVER_FILE}"],
                              stdin=subprocess.PIPE)
    try:
        assert {worker.pid, driver.pid} <= set(children(os.getpid()))
        assert driver_of(os.getpid()) == driver.pid
        assert driver_of(worker.pid) is None
    finally:
        for proc in (worker, driver):
            proc.communicate(b"")
