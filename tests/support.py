"""Helpers shared by integration and fault tests: polling with a deadline, free ports,
consuming a topic to the end."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from conf.settings import PROJECT_ROOT
from streaming.tools.process import free_ports  # noqa: F401  (tests import it from here)

T = TypeVar("T")


def fake_jars_dir(root: Path, spark_jars=("delta-spark_4.2_2.13-4.4.0.jar",
                                          "kafka-clients-4.1.1.jar")) -> Path:
    """A jars folder laid out as deploy/setup.sh leaves it, with placeholder files: enough for
    the settings' checks, which look at names only (no JVM reads these); the Kafka connector
    of the installed pyspark among them."""
    from pyspark import __version__

    spark_jars = (*spark_jars, f"spark-sql-kafka-0-10_2.13-{__version__}.jar")
    (root / "spark").mkdir(parents=True)
    for name in spark_jars:
        (root / "spark" / name).write_bytes(b"jar")
    (root / "localfs").mkdir()
    (root / "localfs" / "delayq-localfs.jar").write_bytes(b"jar")
    return root


def fresh_python(code: str, env: dict | None = None) -> str:
    """What `code` prints in a new interpreter with the project first on its path (no
    environment but `env`, PATH empty by default): what importing a module really imports."""
    prelude = f"import sys; sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + code], env=env or {"PATH": ""},
                          capture_output=True, text=True, check=True).stdout.strip()


def free_port() -> int:
    return free_ports(1)[0]


def assert_eventually(check: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.5,
                      message: str = "condition") -> T:
    """Poll `check` until it returns a truthy value or raises nothing; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
            last_error = None
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f": {last_error}" if last_error else ""
            raise AssertionError(f"{message} not met within {timeout_s:.0f} s{detail}")
        time.sleep(interval_s)


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0,
                idle_s: float = 0.0, done: Callable[[list], bool] | None = None,
                committed: bool = True) -> list:
    """Read `topic` from the beginning until `expected` records arrived (or `done(records)`
    holds), then `idle_s` more seconds to catch extras, or until the deadline passes; as a
    read_committed consumer, as a user's would (`committed` False: read_uncommitted, aborted
    transactions' records too)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    records: list = []
    deadline = time.monotonic() + timeout_s
    try:
        finished = done or (lambda got: len(got) >= expected)
        while time.monotonic() < deadline and not finished(records):
            records.extend(consumer)
        settle = time.monotonic() + (idle_s if finished(records) else 0)
        while time.monotonic() < settle:
            records.extend(consumer)
    finally:
        consumer.close()
    return records


def header_map(record) -> dict[str, bytes]:
    return {k: v for k, v in record.headers}


# How late a test's delivery may be by default: generous for this host on a slow day (the
# suite's deliveries were at most 741 ms late on 2026-12-04), and a path that turns 5 s slower
# fails. A test of a slower path (a restart, an outage) passes its own bound.
LATE_MS = 5_000


def check_deliveries(records, sent: dict, lateness_log=None, late_ms: int = LATE_MS,
                     after_ms: int = 0) -> None:
    """Every record is one of `sent`, exactly once, as sent, never early, at most `late_ms`
    late (after its due time, or after `after_ms` for one due before: when a restarted job
    was up again); all arrived.

    `sent` maps UNIQ_KEY → tests.integration.conftest.Sent. A record's lateness is its
    broker timestamp (the real topics use LogAppendTime) minus its DELIVER_MS header."""
    seen: dict[str, int] = {}
    for record in records:
        headers = header_map(record)
        assert "UNIQ_KEY" in headers and "DELIVER_MS" in headers, record.headers
        uniq = headers["UNIQ_KEY"].decode()
        assert uniq in sent, f"unexpected delivery {uniq}"
        seen[uniq] = seen.get(uniq, 0) + 1
        want = sent[uniq]
        due = int(headers["DELIVER_MS"])
        assert due == want.due_ms, f"{uniq}: DELIVER_MS {due} != append time + delay {want.due_ms}"
        assert record.timestamp >= due, f"{uniq} delivered {due - record.timestamp} ms early"
        late = record.timestamp - max(due, after_ms)
        assert late <= late_ms, f"{uniq} delivered {late} ms after its due time or the " \
                                f"restart, {max(due, after_ms)} (bound {late_ms} ms)"
        assert (record.key, record.value) == (want.key, want.value)
        if want.partition is not None:
            assert record.partition == want.partition
        assert list(record.headers)[:-2] == list(want.headers), "user headers, in order"
        assert [k for k, _ in list(record.headers)[-2:]] == ["UNIQ_KEY", "DELIVER_MS"]
        for name in ("DELAY", "REAL_TOPIC", "REAL_QID", "TIMER_DELIVER_MS", "TIMER_DELAY_MS"):
            assert name not in headers, f"{name} must be removed on delivery"
        if lateness_log is not None:
            lateness_log.append(record.timestamp - due)
    duplicates = {k: n for k, n in seen.items() if n > 1}
    assert not duplicates, f"delivered more than once: {duplicates}"
    missing = set(sent) - set(seen)
    assert not missing, f"{len(missing)} of {len(sent)} never delivered: {sorted(missing)[:5]}"


# The seal key of the unit tests' Rules, and DELAYQ_ROLLED sealed with it.
KEY = "k" * 64


def rolled_header(level: int, due_ms: int, uniq_key: str, topic: str, qid: int | None = None,
                  key: str = KEY) -> tuple[str, bytes]:
    """DELAYQ_ROLLED as the cold tier writes it (sinks/cold.py roll)."""
    from state import headers as H
    from state.seal import rolled_text, seal

    text = rolled_text(level, due_ms, uniq_key, topic, qid)
    return H.ROLLED, f"{level}:{seal(key, text)}".encode()


def store_text(settings, location: str) -> str:
    """A small file of the store (a folder, or an s3a:// one read with pyarrow's S3 client: the
    tests' own Spark has no S3A)."""
    if not location.startswith("s3a://"):
        return Path(location).read_text()
    with s3_client(settings).open_input_stream(location.removeprefix("s3a://")) as stream:
        return stream.read().decode()


def s3_client(settings):
    """pyarrow's S3 client on the tests' s3proxy (streaming/tools/s3.py `client`)."""
    from streaming.tools import s3

    host, port = settings.s3_endpoint.removeprefix("http://").split(":")
    return s3.client(s3.S3Spec(home=Path(), jars=Path(), host=host, port=int(port),
                               access_key=settings.s3_access_key,
                               secret_key=settings.s3_secret_key.get_secret_value()))


def delta_rows(spark, settings, location: str, columns: list[str]) -> list[dict]:
    """A Delta table's rows (`columns` of them, those it has): through the tests' Spark, or on
    S3 through delta-rs as `delayq ledger` reads it; [] without a table."""
    if location.startswith("s3a://"):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        from sinks.store import object_store_options

        try:
            table = DeltaTable(location, storage_options=object_store_options(settings))
        except TableNotFoundError:
            return []
        names = [c for c in columns if c in table.schema().to_arrow().names]
        return table.to_pyarrow_table(columns=names).to_pylist()
    from sinks.delta import table_exists

    if not table_exists(location):
        return []
    frame = spark.read.format("delta").load(location)
    return [row.asDict() for row in frame.select(*[c for c in columns if c in frame.columns])
            .collect()]
