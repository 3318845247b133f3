"""The one place Spark is configured: master, jars, RocksDB state, Delta, Python workers.

Every value comes from `conf/` (see conf/defaults.toml); callers may add `extra` settings
for one session (tests lower memory, benchmarks raise it) but never configure Spark elsewhere.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

from conf.settings import CONF_DIR, Settings
from streaming.spark import cds
from streaming.spark.jars import local_fs_jar, spark_jars

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILE_SYSTEM_CHECKPOINTS = ("org.apache.spark.sql.execution.streaming.checkpointing."
                           "FileSystemBasedCheckpointFileManager")
# Hadoop's local file system with file modes set in the JVM (deploy/maven/localfs).
LOCAL_FS_CLASS = "io.delayq.hadoop.NioLocalFileSystem"
PYTHON_UNIX_SOCKET = "spark.python.unix.domain.socket.enabled"


# The project's log4j2 configuration (conf/log4j2.properties), for every JVM of the job.
LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{CONF_DIR / 'log4j2.properties'}"
# A query stopped mid-batch fails its foreachBatch call; Spark then matches the long Python
# traceback with a backtracking regex that overflows the default 1 MiB stack.
DRIVER_STACK_OPTION = "-Xss16m"


def spark_master(settings: Settings) -> str:
    """`local[*]` becomes one task slot per core (at least one per state partition) for the
    wheel, plus one per dispatch task (which holds its slot for good), plus one per ledger
    partition, so the ledger query's tasks never make the wheel's wait; otherwise as set."""
    if settings.spark_master != "local[*]":
        return settings.spark_master
    cores = max(os.cpu_count() or 1, settings.spark_shuffle_partitions)
    return f"local[{cores + 2 * (settings.ready_partitions or 2)}]"


# What the engine needs whatever the settings: RocksDB state, Delta, the metrics, and the ways
# of Spark's Kafka connector and Python runners this job was measured with.
ENGINE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Spark reads a key's whole value before each write only to count the store's keys, which
    # the job does not report.
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta rebuilds the ledger's snapshot after every commit with this many tasks (default
    # 50); its state is a few thousand log actions, which one task does fastest.
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.metricsEnabled": "true",
    # Kafka is written through Spark's V2 writer (the list is Spark's default less "kafka"): an
    # Observation on the written query (sinks/ready.py) waits forever for its metrics on V1
    # (an internal conf; still so on Spark 4.2.0: tests/integration/test_stack.py).
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # One pool of Python workers, not two: Spark keeps a daemon per worker environment, and
    # only some runners set SPARK_SIMPLIFIED_TRACEBACK in theirs (tracebacks keep PySpark's frames).
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    # The JVM and its Python workers talk over a Unix domain socket: on loopback TCP neither
    # side sets TCP_NODELAY, and each side of a task idled waiting on the other.
    PYTHON_UNIX_SOCKET: "true",
}


def spark_conf(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    local_fs = str(local_fs_jar(settings))
    conf = {
        "spark.app.name": settings.spark_app_name,
        "spark.master": spark_master(settings),
        "spark.jars": ",".join(str(jar) for jar in spark_jars(settings)),
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.ui.port": str(settings.spark_ui_port),
        **ENGINE_CONF,
        # Plus the class data archive of deploy/setup.sh, when there is one (streaming/spark/cds.py).
        "spark.driver.extraJavaOptions":
            f"{LOG4J_OPTION} {DRIVER_STACK_OPTION} {cds.java_options(settings)}".rstrip(),
        "spark.executor.extraJavaOptions": LOG4J_OPTION,
        # Without Hadoop's native library, its local file system runs `chmod` in a child
        # process for each new file; this one sets the mode through java.nio. Hadoop resolves
        # fs.file.impl before spark.jars are loaded, so the jar is on the JVMs' class path.
        "spark.hadoop.fs.file.impl": LOCAL_FS_CLASS,
        "spark.driver.extraClassPath": local_fs,
        "spark.executor.extraClassPath": local_fs,
        "spark.sql.warehouse.dir": str(settings.data_path / "warehouse"),
        "spark.metrics.conf": str(CONF_DIR / "spark-metrics.properties"),
        # The driver's Python and the workers' Python must be the same interpreter.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    if settings.spark_shuffle_partitions:   # 0: sized at the job's start (streaming/wheel/sizing.py)
        conf["spark.sql.shuffle.partitions"] = str(settings.spark_shuffle_partitions)
    if not settings.store.strip():
        # Spark's default manager renames checkpoint files through Hadoop's FileContext, which
        # runs `readlink` in a child process per local path; this one uses rename(2), atomic
        # under data_dir. A store keeps Spark's default. (An internal conf: c99d83f measured
        # steady lateness p99 4.2-5.9 s against 2.9-4.5 s without it, three pairs.)
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FILE_SYSTEM_CHECKPOINTS
    conf.update(extra or {})
    return conf


def build_session(settings: Settings, extra: dict[str, str] | None = None):
    """Create (or return the running) SparkSession configured from settings."""
    if settings.spark_master.startswith("local"):
        # Keep a local job on loopback instead of whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers import the project's packages; make them findable without installing.
    project_root = str(CONF_DIR.parent)
    path = os.environ.get("PYTHONPATH", "")
    if project_root not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (project_root, path) if p)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_conf(settings, extra).items():
        builder = builder.config(key, value)
    # Under spark-submit the JVM is already there, and started this process.
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    with contextlib.nullcontext() if under_spark_submit else _jvm_output_quieted():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings.spark_log_level)
    return session


# What the driver's JVM prints outside log4j (conf/log4j2.properties sets what log4j prints) on
# every healthy run: the JVM's notice of the vector module Spark's launcher adds.
QUIET_LINES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)
# Set when a clean stop begins (streaming/runner.py). From then on, a Python worker whose
# socket the stopping JVM closed under it may print PySpark's traceback of the broken pipe;
# any other traceback still shows.
STOPPING = threading.Event()
_TRACEBACKS = (b"Traceback (most recent call last):",
               b"PySpark daemon failed to flush the output to the worker process:")
_CLOSED_UNDER_IT = (b"BrokenPipeError", b"ConnectionResetError")


# Where the readers of the JVM's output write its stdout (1) and stderr (2): copies of this
# process's own while the JVM starts, then the descriptors themselves, wherever they point then.
_OUT: dict[int, int] = {}


@contextlib.contextmanager
def _jvm_output_quieted():
    """The driver's JVM inherits this process's stdout and stderr when PySpark starts it: while
    it starts, both are pipes read by quiet_jvm_output, which writes on to the real ones; this
    process gets its own back after, the JVM (and the Python workers it starts) keep the pipes.
    Once a process: PySpark keeps its JVM for the process's life. What the JVM writes after this
    process ended is not shown."""
    if _OUT:
        yield
        return
    try:
        for fd in (1, 2):
            read_end, write_end = os.pipe()
            _OUT[fd] = os.dup(fd)
            threading.Thread(target=quiet_jvm_output, args=(os.fdopen(read_end, "rb"), fd),
                             daemon=True, name=f"delayq-jvm-output-{fd}").start()
            _flush()
            os.dup2(write_end, fd)
            os.close(write_end)
        yield
    finally:
        _flush()
        for fd, saved in list(_OUT.items()):
            os.dup2(saved, fd)
            _OUT[fd] = fd   # `saved` stays open: a reader may still be writing to it


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def quiet_jvm_output(stream, fd: int) -> None:
    """Copy the JVM's output, line by line, to this process's file descriptor `fd`, less the
    lines above. Written to the descriptor, as the JVM would, whatever sys.stderr is now; never
    stops reading while the JVM writes, or the JVM would block on a full pipe."""
    after_quiet, block = False, []
    for line in iter(stream.readline, b""):
        text = line.rstrip(b"\r\n")
        if block:   # a traceback: kept whole until its exception's line
            block.append(line)
            if text[:1].isspace() or text in _TRACEBACKS:
                continue
            stop_notice = (STOPPING.is_set() and text.startswith(_CLOSED_UNDER_IT)
                           and any(b"pyspark" in b for b in block))
            if not stop_notice:
                _write(fd, b"".join(block))
            block = []
            continue
        if text in _TRACEBACKS:
            block = [line]
            continue
        # A quiet line is dropped, and so is the empty line after one.
        quiet = text in QUIET_LINES
        if not quiet and not (after_quiet and not text):
            _write(fd, line)
        after_quiet = quiet
    if block and not STOPPING.is_set():   # cut off by the JVM's exit at a clean stop: dropped
        _write(fd, b"".join(block))


def _write(fd: int, data: bytes) -> None:
    fd = _OUT.get(fd, fd)
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
