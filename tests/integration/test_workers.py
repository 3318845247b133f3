"""Spark's own Python workers: they settle their collector at their first task
(state/worker.py), and the job's Python functions all run in one pool of them."""
from __future__ import annotations

import contextlib
import os

import psutil
import pyarrow as pa

from state.parse import make_parser
from streaming.producer import DelayProducer
from tests.support import consume_all
from tests.unit.test_wheel import RULES


def test_a_spark_python_worker_freezes_what_it_holds_at_the_parse(spark):
    def probe(batches):
        import gc
        import os

        from state import worker

        # As at this worker's first task, whatever tasks it ran before in this session.
        worker._settled = False
        gc.unfreeze()
        before = gc.get_freeze_count()
        for batch in batches:
            pass
        list(make_parser(RULES, 1_000, 2, -1)(iter([])))   # the job's parse, on no rows
        yield pa.record_batch({"reused": [bool(os.environ.get("SPARK_REUSE_WORKER"))],
                               "before": [before], "after": [gc.get_freeze_count()]})

    [row] = (spark.range(1, numPartitions=1)
             .mapInArrow(probe, "reused boolean, before long, after long").collect())
    assert row.reused
    assert row.before == 0
    assert row.after > 10_000   # pyarrow's, pandas' and PySpark's objects, among others


def test_a_spark_python_worker_talks_to_the_jvm_over_a_unix_socket(spark):
    """Over loopback TCP (neither side of Spark's socket sets TCP_NODELAY) each side of a task
    waited on the other, about 150 ms a batch: the session asks for a Unix domain
    socket (streaming/spark/session.py), and the worker running a task has no TCP connection."""
    def probe(batches):
        import psutil

        for batch in batches:
            pass
        me = psutil.Process()
        yield pa.record_batch({"tcp": [len(me.net_connections(kind="tcp"))],
                               "unix": [len(me.net_connections(kind="unix"))]})

    [row] = spark.range(1, numPartitions=1).mapInArrow(probe, "tcp long, unix long").collect()
    assert row.tcp == 0
    assert row.unix >= 1


def test_the_parse_the_wheel_and_the_hold_share_one_pool_of_python_workers(
        job_settings, start_job, new_topic, kafka_bootstrap):
    """Spark keeps a daemon (and its workers) per distinct worker environment; the job's
    runners once had two between them (streaming/spark/session.py, simplifiedTraceback). The
    dispatch tasks run the JVM's threads nicer than themselves (streaming/dispatch/priority.py)."""
    settings = job_settings(dispatch_jvm_nice=5)
    real = new_topic(partitions=1, message_timestamp_type="LogAppendTime")
    try:
        start_job(settings)
        with DelayProducer(settings) as producer:
            producer.send(real, b"through the wheel", level=1)
        [record] = consume_all(kafka_bootstrap, real, expected=1, timeout_s=90, idle_s=2)
        assert record.value == b"through the wheel"
        [daemon] = _python_daemons()
        own = os.getpriority(os.PRIO_PROCESS, 0)   # a suite started under `nice` runs above 0
        assert {_nice(t.id) for t in _spark_jvm().threads()} - {None} == {max(own, 5)}
        assert {worker.nice() for worker in [daemon, *daemon.children()]} == {own}
    finally:   # the next tests' JVM as it was (lowering a nice again needs root, as here)
        for thread in _spark_jvm().threads():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, thread.id, os.getpriority(os.PRIO_PROCESS, 0))


def _python_daemons() -> list:
    """The PySpark daemons under this test session's Spark JVM."""
    return [child for child in _spark_jvm().children() if "pyspark.daemon" in _command(child)]


def _spark_jvm() -> psutil.Process:
    [jvm] = [child for child in psutil.Process().children()
             if "org.apache.spark.deploy.SparkSubmit" in _command(child)]
    return jvm


def _command(process) -> str:
    """A process's command line; "" for one that has ended (an earlier test's child not yet
    reaped is a zombie, whose command line psutil refuses to read)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def _nice(tid: int) -> int | None:
    """A thread's nice; None for one that ended meanwhile."""
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None
