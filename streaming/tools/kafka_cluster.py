"""A replicated Kafka cluster on loopback for the fault tests: three KRaft nodes, each broker and
controller (combined), from the same jars as the embedded broker (streaming/tools/broker.py).
Three voters are formatted with `--initial-controllers` (not `--standalone`, which makes a
quorum of one); internal topics are replicated three times with `min.insync.replicas` 2, so
one node may be down and every write with acks=all still lands on two. The embedded default
stays one broker.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from streaming.tools import broker, process

NODES = 3


def specs(home: Path, jars: Path, ports: list[int], controller_ports: list[int],
          heap: str = "384m") -> list[broker.BrokerSpec]:
    """The nodes' specs: node i (1-based) serves clients on `ports[i - 1]` and its controller
    on `controller_ports[i - 1]`."""
    voters = ",".join(f"127.0.0.1:{port}" for port in controller_ports)
    replicated = {"offsets.topic.replication.factor": "3", "min.insync.replicas": "2",
                  "transaction.state.log.replication.factor": "3",
                  "transaction.state.log.min.isr": "2",
                  "share.coordinator.state.topic.replication.factor": "3",
                  "share.coordinator.state.topic.min.isr": "2",
                  "default.replication.factor": "3",
                  # A node killed is taken as gone after 3 s (Kafka's default: 9 s), so that
                  # its partitions' leadership moves within a test.
                  "broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
                  "controller.quorum.bootstrap.servers": voters}
    return [broker.BrokerSpec(home=home / f"node-{i + 1}", jars=jars, port=ports[i],
                              controller_port=controller_ports[i], heap=heap,
                              extra={**replicated, "node.id": str(i + 1)})
            for i in range(NODES)]


def bootstrap(nodes: list[broker.BrokerSpec]) -> str:
    return ",".join(spec.bootstrap for spec in nodes)


def _format(nodes: list[broker.BrokerSpec]) -> None:
    """Each node's storage, formatted once with the same cluster id and initial voters."""
    if all((spec.data_dir / "meta.properties").exists() for spec in nodes):
        return
    cluster_id = broker.new_cluster_id()
    voters = ",".join(f"{spec.extra['node.id']}@{spec.host}:{spec.controller_port}:"
                      f"{broker.new_cluster_id()}" for spec in nodes)
    for spec in nodes:
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        spec.data_dir.mkdir(parents=True, exist_ok=True)
        spec.properties_file.write_text("".join(
            f"{k}={v}\n" for k, v in broker.server_properties(spec).items()))
        done = subprocess.run(broker._java(spec, "kafka.tools.StorageTool", "format", "-t",
                                           cluster_id, "--initial-controllers", voters, "-c",
                                           str(spec.properties_file)),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise broker.BrokerError(f"formatting {spec.data_dir} failed: "
                                     f"{(done.stderr or done.stdout).strip()[-2000:]}")


def launch(spec: broker.BrokerSpec) -> int:
    """Start one node's JVM (formatted already) without waiting for it: a node answers only
    once a majority of the voters runs."""
    with open(spec.log_dir / "stdout.log", "ab") as out:
        node = subprocess.Popen(broker._java(spec, "kafka.Kafka", str(spec.properties_file)),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    spec.pid_file.write_text(str(node.pid))
    return node.pid


def start(nodes: list[broker.BrokerSpec], timeout_s: float = 180.0) -> None:
    """Format, start every node, and wait until each answers."""
    _format(nodes)
    pids = [broker.read_pid(spec) or launch(spec) for spec in nodes]
    for spec, pid in zip(nodes, pids):
        broker.wait_ready(spec, pid, timeout_s)


def kill(spec: broker.BrokerSpec) -> None:
    """SIGKILL one node, its logs left as a crash leaves them."""
    pid = broker.read_pid(spec)
    if pid is None:
        return
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        process.reap(pid)   # a child of this process stays a zombie until then
        if not process.pid_alive(pid):
            break
        time.sleep(0.1)
    spec.pid_file.unlink(missing_ok=True)


def restart(spec: broker.BrokerSpec, timeout_s: float = 180.0) -> None:
    broker.wait_ready(spec, launch(spec), timeout_s)

