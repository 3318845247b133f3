"""Session fixtures: one real Kafka broker (KRaft, from .lib/kafka) and one Spark session
for the whole run, and a fresh topic per test.

DELAYQ_TEST_BOOTSTRAP=host:port points the suite at an existing broker instead.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from hypothesis import settings as hypothesis_settings

from tests.support import free_ports

PROJECT = Path(__file__).resolve().parent.parent

# No time limit on one drawn example (hypothesis's default: 200 ms): an example takes about
# 3 ms alone, and a property test failed once beside a starting broker and job, passing on
# each rerun and on its saved examples; the host's load is no property of the code.
hypothesis_settings.register_profile("delayq", deadline=None)
hypothesis_settings.load_profile("delayq")


def pytest_collection_modifyitems(items):
    for item in items:
        path = str(item.fspath)
        if "/integration/" in path:
            item.add_marker(pytest.mark.integration)
        elif "/faults/" in path:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def work_dir():
    path = Path(tempfile.mkdtemp(prefix="delayq-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(work_dir):
    external = os.environ.get("DELAYQ_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    from streaming.tools import broker

    port, controller_port = free_ports(2)
    spec = broker.BrokerSpec(
        home=work_dir / "kafka",
        jars=PROJECT / ".lib" / "kafka",
        port=port,
        controller_port=controller_port,
        heap="768m",
    )
    broker.start(spec)
    try:
        yield spec.bootstrap
    finally:
        broker.stop(spec)


@pytest.fixture(scope="session")
def admin(kafka_bootstrap):
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    yield client
    client.close()


@pytest.fixture
def new_topic(admin, request):
    """Factory: new_topic(partitions=1, **configs) -> a fresh, uniquely named topic."""
    from kafka.admin import NewTopic

    stem = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]

    def make(partitions: int = 1, name: str | None = None, **configs: str) -> str:
        topic = name or f"{stem}-{uuid.uuid4().hex[:8]}"
        admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1,
                      topic_configs={k.replace("_", "."): v for k, v in configs.items()})],
            wait_for_metadata=True,
        )
        return topic

    return make


@pytest.fixture(scope="session")
def hdfs_uri(work_dir):
    """A real HDFS (NameNode + DataNode, from .lib/hdfs) for the tests of a store, started at
    the first test that asks for it."""
    from streaming.tools import hdfs

    rpc, http, data, data_http, ipc = free_ports(5)
    spec = hdfs.HdfsSpec(home=work_dir / "hdfs", jars=PROJECT / ".lib" / "hdfs", port=rpc,
                         http_port=http, datanode_ports=(data, data_http, ipc))
    hdfs.start(spec)
    try:
        yield spec.uri
    finally:
        hdfs.stop(spec)


@pytest.fixture(scope="session")
def s3_store(work_dir):
    """A real S3 API server (s3proxy, from .lib/s3proxy) and a bucket on it, started at the first
    test that asks for it: the settings that point the job at it, less `store`."""
    from streaming.tools import s3

    spec = s3.S3Spec(home=work_dir / "s3", jars=PROJECT / ".lib" / "s3proxy",
                     port=free_ports(1)[0], access_key="delayq", secret_key="test-secret")
    s3.start(spec, ("delayq",))
    try:
        yield {"s3_endpoint": spec.endpoint, "s3_path_style": True, "s3_access_key": "delayq",
               "s3_secret_key": "test-secret"}
    finally:
        s3.stop(spec)


@pytest.fixture(scope="session")
def test_settings(work_dir, kafka_bootstrap):
    """Settings for tests: the session broker, short levels, small Spark."""
    from conf import load_settings

    return load_settings(
        bootstrap_servers=kafka_bootstrap,
        data_dir=work_dir / "data",
        delay_levels="1s 2s 3s",
        # Immediate and level-1 messages go the dispatch tasks' own way from the intake, levels
        # 2 and 3 through the wheel: every test of delivery covers both paths.
        dispatch_direct_max_delay_ms=1000,
        # A missing real topic dead-letters its message after 3 s, not 10 (the broker is local).
        dispatch_topic_wait_ms=3000,
        # Timers due from 1 s to 8 s after their append go through each dispatch task's ring
        # of 6 slots of 2 s (streaming/dispatch/ring.py), later ones through the wheel.
        ring_slots=6,
        ring_slot_ms=2000,
        ring_read_lead_ms=1000,
        # Gathered for 200 ms, not 1 s: in a horizon of 12 s a timer would often find its slot
        # read by then and be held instead, the ring passed by.
        ring_write_ms=200,
        spark_master="local[*]",
        spark_driver_memory="1500m",
        spark_shuffle_partitions=2,
        # The ledger's tests wait for its rows: sooner than the default's 30 s.
        ledger_interval="10s",
        # The session's JVM serves every test and its own Spark: left at its priority (one test
        # lowers it, tests/integration/test_workers.py).
        dispatch_jvm_nice=0,
    )


@pytest.fixture(scope="session")
def spark(test_settings):
    from streaming.spark.session import build_session

    session = build_session(test_settings, {"spark.sql.streaming.minBatchesToRetain": "20"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def lateness_log(request):
    """Every delivery's lateness (ms) seen by the tests; summarised at the end of the run."""
    log: list[int] = []
    request.config._delayq_lateness = log
    return log


def pytest_terminal_summary(terminalreporter):
    values = sorted(getattr(terminalreporter.config, "_delayq_lateness", None) or [])
    if not values:
        return
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    terminalreporter.write_line(
        f"delayq lateness over {len(values)} deliveries: p50 {pick(0.5)} ms, "
        f"p99 {pick(0.99)} ms, max {values[-1]} ms, early {sum(1 for v in values if v < 0)}")
