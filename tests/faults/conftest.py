"""Fault tests run the job as its own process (`delayq run`), so it can be killed for real."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import PROJECT

READY_LINE = "delayq running"


class JobProcess:
    def __init__(self, env: dict[str, str], log: Path):
        self.env = env
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 240) -> None:
        self.starts += 1
        out = open(self.log, "a")
        out.write(f"\n==== start {self.starts} ====\n")
        out.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "run"], cwd=PROJECT, env=self.env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if text.count(READY_LINE) >= self.starts:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"delayq run exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"delayq run not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group: the Python driver and its JVM, like a lost host."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def job_process(kafka_bootstrap, work_dir):
    """Factory: a `delayq run` process on fresh topics; returns (JobProcess, settings)."""
    from conf import load_settings

    procs = []

    def make(**overrides):
        tag = uuid.uuid4().hex[:8]
        values = dict(bootstrap_servers=kafka_bootstrap, data_dir=str(work_dir / f"fault-{tag}"),
                      intake_topic=f"intake-{tag}", dlq_topic=f"intake-{tag}.DLQ",
                      delay_levels="1s 2s 3s", spark_master="local[2]",
                      spark_driver_memory="1g")
        values.update(overrides)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
        env.update({f"DELAYQ_{k.upper()}": str(v) for k, v in values.items()})
        env["PYTHONUNBUFFERED"] = "1"
        settings = load_settings(**values)
        proc = JobProcess(env, work_dir / f"job-{tag}.log")
        procs.append(proc)
        return proc, settings

    yield make
    for proc in procs:
        proc.kill()
