"""The embedded Apache Kafka broker: one KRaft node (broker + controller) on loopback.

Runs from the jars `deploy/setup.sh` resolved into `.lib/kafka`; nothing is downloaded.
Its data, log and pid file live in `<data_dir>/kafka`. Start is idempotent, stop is clean.
"""
from __future__ import annotations

import base64
import os
import subprocess
import time
import uuid
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from conf.settings import CONF_DIR
from state.errors import DelayqError
from streaming.tools import process
from streaming.kafka.admin import port_open

# A cold JVM on 2 busy cores takes 5-15 s to open its listener; 90 s leaves room for CI.
READY_TIMEOUT_S = 90.0
# Kafka flushes and closes its logs on SIGTERM; a large log can take a while.
STOP_TIMEOUT_S = 30.0


class BrokerError(DelayqError):
    """The local Kafka broker could not be started, reached or stopped."""


@dataclass(frozen=True)
class BrokerSpec:
    """Where and how one local broker runs."""

    home: Path
    jars: Path
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    heap: str = "512m"
    extra: dict[str, str] = field(default_factory=dict)
    # listener name → protocol, for brokers that also serve SASL or TLS.
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Environment of the broker's JVM besides this process's (the tests' shifted clock).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def properties_file(self) -> Path:
        return self.home / "server.properties"


def spec_from_settings(settings) -> BrokerSpec:
    return BrokerSpec(
        home=settings.data_path / "kafka",
        jars=settings.jars_path / "kafka",
        host=settings.kafka_host,
        port=settings.kafka_port,
        controller_port=settings.kafka_controller_port,
        heap=settings.kafka_heap,
    )


def server_properties(spec: BrokerSpec) -> dict[str, str]:
    listeners = {"PLAINTEXT": ("PLAINTEXT", spec.port)} | dict(spec.listeners)
    listener_list = [f"{name}://{spec.host}:{port}" for name, (_, port) in listeners.items()]
    protocol_map = [f"{name}:{proto}" for name, (proto, _) in listeners.items()]
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{spec.host}:{spec.controller_port}",
        "listeners": ",".join(listener_list + [f"CONTROLLER://{spec.host}:{spec.controller_port}"]),
        "advertised.listeners": ",".join(listener_list),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(protocol_map + ["CONTROLLER:PLAINTEXT"]),
        "log.dirs": str(spec.data_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Real topics must exist: a typo in REAL_TOPIC is dead-lettered, not auto-created.
        "auto.create.topics.enable": "false",
    }
    props.update(spec.extra)
    return props


def read_pid(spec: BrokerSpec) -> int | None:
    return process.read_pid(spec.pid_file)


def broker_answers(bootstrap: str, timeout_s: float = 5.0, **client_config) -> bool:
    """True when the broker serves metadata, the real sign of readiness (not just a port)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=int(timeout_s * 1000),
            **client_config,
        )
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.describe_cluster()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


def gives_producer_ids(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """True once the broker hands an idempotent producer its id. A new broker first answers
    "coordinator load in progress" while it fetches a block of ids from its controller, and
    every idempotent client (the job's librdkafka producers) would log its retries."""
    import json
    import logging

    from confluent_kafka import Producer

    quiet = logging.getLogger("delayq.broker.probe")
    quiet.propagate, quiet.disabled = False, True
    eos: dict = {}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "statistics.interval.ms": 100, "logger": quiet,
                         "stats_cb": lambda stats: eos.update(json.loads(stats).get("eos", {}))})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and eos.get("idemp_state") != "Assigned":
            producer.poll(0.1)
    finally:
        producer.close()
    return eos.get("idemp_state") == "Assigned"


def _java(spec: BrokerSpec, main_class: str, *args: str) -> list[str]:
    if not spec.jars.is_dir() or not any(spec.jars.glob("kafka_2.13-*.jar")):
        raise BrokerError(
            f"no Kafka jars in {spec.jars}; run deploy/setup.sh once to resolve them with Maven"
        )
    return [
        "java",
        f"-Xmx{spec.heap}",
        f"-Xms{spec.heap}",
        "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={CONF_DIR / 'kafka-log4j2.properties'}",
        f"-Dkafka.logs.dir={spec.log_dir}",
        "-cp",
        f"{spec.jars}/*",
        main_class,
        *args,
    ]


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64. Like Kafka's Uuid.randomUuid,
    never one starting with '-', which the storage tool would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _format_storage(spec: BrokerSpec) -> None:
    if (spec.data_dir / "meta.properties").exists():
        return
    cluster_id = new_cluster_id()
    command = _java(
        spec, "kafka.tools.StorageTool", "format", "--standalone",
        "-t", cluster_id, "-c", str(spec.properties_file),
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BrokerError(
            f"formatting Kafka storage in {spec.data_dir} failed: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )


def start(spec: BrokerSpec, timeout_s: float = READY_TIMEOUT_S) -> int:
    """Start the broker unless it already runs; return its pid once it answers."""
    running = read_pid(spec)
    if running is not None:
        wait_ready(spec, running, timeout_s)
        return running
    if port_open(spec.host, spec.port):
        raise BrokerError(
            f"port {spec.bootstrap} is taken by another process; stop it or set "
            f"DELAYQ_KAFKA_PORT to a free port"
        )
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    props = server_properties(spec)
    spec.properties_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    _format_storage(spec)
    out = open(spec.log_dir / "stdout.log", "ab")
    process = subprocess.Popen(
        _java(spec, "kafka.Kafka", str(spec.properties_file)),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # outlives the CLI that started it; stop() ends it
        env={**os.environ, **spec.env},
    )
    out.close()
    spec.pid_file.write_text(str(process.pid))
    wait_ready(spec, process.pid, timeout_s)
    return process.pid


def wait_ready(spec: BrokerSpec, pid: int, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while time.monotonic() < deadline:
        if not process.pid_alive(pid):
            raise BrokerError(
                f"the Kafka broker (pid {pid}) exited while starting; last log lines:\n"
                + tail(spec, 30)
            )
        if (port_open(spec.host, spec.port) and broker_answers(spec.bootstrap)
                and gives_producer_ids(spec.bootstrap)):
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise BrokerError(
        f"the Kafka broker on {spec.bootstrap} did not answer within {timeout_s:.0f} s; "
        f"see {spec.log_dir / 'server.log'}"
    )


def stop(spec: BrokerSpec, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker with SIGTERM (SIGKILL after timeout_s). False if it was not running."""
    return process.terminate(spec.pid_file, timeout_s)


def status(spec: BrokerSpec) -> dict[str, object]:
    pid = read_pid(spec)
    return {
        "running": pid is not None,
        "pid": pid,
        "bootstrap": spec.bootstrap,
        "answers": pid is not None and broker_answers(spec.bootstrap, timeout_s=3.0),
        "home": str(spec.home),
    }


def tail(spec: BrokerSpec, lines: int = 20) -> str:
    chunks = []
    for name in ("stdout.log", "server.log"):
        path = spec.log_dir / name
        if path.exists():
            chunks.extend(path.read_text(errors="replace").splitlines()[-lines:])
    return "\n".join(chunks[-lines:])


@contextlib.contextmanager
def embedded(settings) -> Iterator[None]:
    """The local broker around a run when the settings name no Kafka (`delayq run`, the demo);
    stopped after only if this started it."""
    if not settings.embedded:
        yield
        return
    spec = spec_from_settings(settings)
    was_running = read_pid(spec) is not None
    start(spec)
    try:
        yield
    finally:
        if not was_running:
            stop(spec)
