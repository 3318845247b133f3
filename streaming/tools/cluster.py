"""A local Spark standalone cluster: one Master and N Workers on loopback, run from the
installed pyspark (`bin/spark-class`), for trials and tests of the cluster path.

    delayq cluster start          # Master spark://127.0.0.1:7077, UI :8080, 2 Workers
    delayq submit --master spark://127.0.0.1:7077
    delayq cluster stop

Pid files, logs and each Worker's work folder live in `<data_dir>/spark-cluster`. Every
process runs on this machine, so the checkpoint's local path is shared by all of them; on a
real cluster the checkpoint must be on storage every node reaches (HDFS, S3, a shared mount).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conf.settings import CONF_DIR, Settings
from state.errors import DelayqError
from streaming.spark.jars import spark_home
from streaming.tools import process

READY_TIMEOUT_S = 120.0


class ClusterError(DelayqError):
    """The local Spark cluster could not be started or reached."""


@dataclass(frozen=True)
class ClusterSpec:
    home: Path
    host: str = "127.0.0.1"
    port: int = 7077
    webui_port: int = 8080
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def pid_file(self, name: str) -> Path:
        return self.home / f"{name}.pid"

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]


def spec_from_settings(settings: Settings) -> ClusterSpec:
    return ClusterSpec(home=settings.data_path / "spark-cluster", host=settings.cluster_host,
                       port=settings.cluster_port, webui_port=settings.cluster_webui_port,
                       workers=settings.cluster_workers,
                       worker_cores=settings.cluster_worker_cores,
                       worker_memory=settings.cluster_worker_memory)


def _launch(spec: ClusterSpec, name: str, *args: str) -> int:
    spec.home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": spec.host,
           "SPARK_LOG_DIR": str(spec.home), "SPARK_NO_DAEMONIZE": "1",
           "SPARK_DAEMON_JAVA_OPTS":
               f"-Dlog4j2.configurationFile=file:{CONF_DIR / 'log4j2.properties'}"}
    with open(spec.home / f"{name}.log", "ab") as out:
        proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    spec.pid_file(name).write_text(str(proc.pid))
    return proc.pid


def start(spec: ClusterSpec, timeout_s: float = READY_TIMEOUT_S) -> dict:
    """Start the Master and the Workers that are not running; return once every Worker is
    registered ALIVE with the Master."""
    if process.read_pid(spec.pid_file("master")) is None:
        if process.port_open(spec.host, spec.port):
            raise ClusterError(f"port {spec.host}:{spec.port} is taken by another process; "
                               f"set DELAYQ_CLUSTER_PORT to a free port")
        _launch(spec, "master", "org.apache.spark.deploy.master.Master", "--host", spec.host,
                "--port", str(spec.port), "--webui-port", str(spec.webui_port))
    _wait(spec, lambda state: state is not None, timeout_s, "the Spark Master to answer")
    for name in spec.worker_names():
        start_worker(spec, name)
    return _wait(spec, lambda state: state is not None and alive_workers(state) >= spec.workers,
                 timeout_s, f"{spec.workers} Spark Workers to register")


def start_worker(spec: ClusterSpec, name: str) -> int:
    running = process.read_pid(spec.pid_file(name))
    if running is not None:
        return running
    work = spec.home / name
    work.mkdir(parents=True, exist_ok=True)
    return _launch(spec, name, "org.apache.spark.deploy.worker.Worker", "--host", spec.host,
                   "--webui-port", "0", "--cores", str(spec.worker_cores),
                   "--memory", spec.worker_memory, "--work-dir", str(work), spec.master_url)


def master_state(spec: ClusterSpec) -> dict | None:
    """The Master's own report (its web UI's /json/), None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{spec.webui}/json/", timeout=3) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def alive_workers(state: dict) -> int:
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def _wait(spec: ClusterSpec, ready, timeout_s: float, what: str) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = master_state(spec)
        if ready(state):
            return state
        if process.read_pid(spec.pid_file("master")) is None:
            raise ClusterError(f"the Spark Master exited; see {spec.home / 'master.log'}:\n"
                               f"{tail(spec, 'master')}")
        time.sleep(0.5)
    raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}; logs in {spec.home}")


def stop(spec: ClusterSpec) -> list[str]:
    """Stop the Workers, then the Master; the names of those that were running."""
    stopped = []
    for name in [*spec.worker_names(), "master"]:
        if process.terminate(spec.pid_file(name), timeout_s=30):
            stopped.append(name)
    return stopped


def status(spec: ClusterSpec) -> dict:
    state = master_state(spec)
    return {"master": spec.master_url, "web_ui": spec.webui,
            "master_running": process.read_pid(spec.pid_file("master")) is not None,
            "workers_alive": alive_workers(state) if state else 0,
            "cores": state.get("cores", 0) if state else 0,
            "applications": [a.get("name") for a in state.get("activeapps", [])] if state else []}


def tail(spec: ClusterSpec, name: str, lines: int = 20) -> str:
    path = spec.home / f"{name}.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
