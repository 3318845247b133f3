"""The one place Spark is configured: master, jars, RocksDB state, Delta, Python workers.

Every value comes from `conf/` (see conf/defaults.toml); callers may add `extra` settings
for one session (tests lower memory, benchmarks raise it) but never configure Spark elsewhere.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from conf.settings import CONF_DIR, Settings
from streaming import cds
from streaming.jars import local_fs_jar, spark_jars

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
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
    """The master Spark is given: `local[*]` becomes one task slot
    per core (at least one per state partition) for the wheel, plus one per dispatch task,
    which holds its slot for good but waits on Kafka most of the time, plus one per ledger
    partition, so the ledger query's tasks (seconds each) never make the wheel's wait for a
    slot; otherwise as set. At 5,000 msg/s on the 2-core host, the ledger query's two tasks
    in the wheel's slots (local[5]) put 10 s messages' p99 lateness at 761 ms, beside them
    (local[6]) at 167 ms."""
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
    # the job does not report; a wheel group's list state is one value in RocksDB.
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta rebuilds the ledger's snapshot after every commit with this many tasks
    # (default 50). Its state is a few thousand log actions: one task does it (a ledger
    # commit's step fell from 3.4 s to 0.9 s, median, measured on the 2-core host).
    "spark.databricks.delta.snapshotPartitions": "1",
    # A wheel group's list state (transformWithState) comes to Python this many chunks at a
    # time (default 10,000: a burst's whole group, pickled in one message in the executor's
    # heap); each chunk is at most about wheel_chunk_kb.
    "spark.sql.execution.arrow.transformWithStateInPySpark.maxStateRecordsPerBatch": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.prometheus.enabled": "true",
    "spark.sql.streaming.metricsEnabled": "true",
    # Kafka is read through Spark's V1 source (KafkaSource), not its V2 stream: the two
    # read the same offsets the same way and keep them in the same checkpoint format, but
    # the V2 stream's progress metrics throw a NullPointerException on the first batch of a
    # restart that runs a batch again (SPARK-55271, Spark 4.1.1: they read offsets only
    # the next batch's planning sets), which failed the query after that batch with the
    # exception in the log, and the job started the query again (5.6-7.9 s on this
    # project's machine; the first new delivery did not come measurably sooner without
    # it). The V1 source reports no such metrics.
    "spark.sql.streaming.disabledV2MicroBatchReaders": KAFKA_PROVIDER,
    # Kafka is written through Spark's V2 writer, whose plan holds the written query: an
    # Observation on it (sinks/ready.py counts a batch's rows so, in the write's own job)
    # gets its metrics; through the V1 writer (Spark's default list below with "kafka")
    # it waits for them forever. Both writers send with the same KafkaDataWriter.
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # One pool of Python workers instead of two: Spark keeps a daemon and its workers per
    # distinct worker environment, and only some of its Python runners set
    # SPARK_SIMPLIFIED_TRACEBACK in theirs, so the job's executor ran two daemons, each
    # with its own workers and their imports.
    # A Python error's traceback then keeps PySpark's own frames.
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    # The JVM and its Python workers talk over a Unix domain socket, not loopback TCP.
    # Neither side of Spark's TCP socket sets TCP_NODELAY, and each side of a task waited
    # on the other with no CPU spent (small writes held by Nagle, most likely): an idle
    # job's batch took 404 ms on TCP and 250 ms on this socket, its Python stages' tasks
    # 31-61 ms instead of 110-160 (measured on the 2-core host).
    PYTHON_UNIX_SOCKET: "true",
}


def spark_conf(settings: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    log4j = LOG4J_OPTION
    local_fs = str(local_fs_jar(settings))
    conf = {
        "spark.app.name": settings.spark_app_name,
        "spark.master": spark_master(settings),
        "spark.jars": ",".join(str(jar) for jar in spark_jars(settings)),
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.ui.port": str(settings.spark_ui_port),
        **ENGINE_CONF,
        # Plus the class data archive of deploy/setup.sh, when there is one (streaming/cds.py).
        "spark.driver.extraJavaOptions":
            f"{log4j} {DRIVER_STACK_OPTION} {cds.java_options(settings)}".rstrip(),
        "spark.executor.extraJavaOptions": log4j,
        # Without Hadoop's native library (PyPI's pyspark has none), Hadoop's local file
        # system sets each new file's mode by running `chmod` in a child process of the JVM:
        # two per checkpoint file (the file and its .crc), every batch. This one sets the
        # mode through java.nio. Hadoop resolves fs.file.impl at its first file: path, before
        # spark.jars are loaded, so the jar is on the JVMs' class path from their start.
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
    if settings.spark_shuffle_partitions:   # 0: sized at the job's start (streaming/sizing.py)
        conf["spark.sql.shuffle.partitions"] = str(settings.spark_shuffle_partitions)
    if not settings.store.strip():
        # Spark writes each checkpoint file (offset and commit logs, the state's changelog)
        # to a temporary file and renames it into place. Its default manager renames through
        # Hadoop's FileContext, which on the local file system checks each path by running
        # `readlink` in a child process of the JVM: 2,054-2,715 of them in a 2-minute bench
        # run (16-17 with this manager). The FileSystem manager renames with rename(2),
        # atomic on the local or mounted folder under data_dir. A store keeps Spark's default.
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

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    conf = spark_conf(settings, extra)
    if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # (Under spark-submit the JVM is already there, and started this process.)
        SparkContext._ensure_initialized(gateway=_quiet_gateway(conf))
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings.spark_log_level)
    return session


# What the driver's JVM prints outside log4j (conf/log4j2.properties sets what log4j prints) on
# every healthy run: the JVM's notice of the vector module Spark's launcher adds, and the
# prints of PySpark's planner worker for the wheel's transformWithState, a block per query
# start, each line followed by an empty one.
QUIET_LINES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)
QUIET_PREFIXES = (b"Starting Streaming TransformWithStateInPandas Python worker",
                  b"Streaming TransformWithStateInPandas Python worker ")
# Set when a clean stop begins (streaming/runner.py). From then on, a Python worker whose
# socket the stopping JVM closed under it may print PySpark's traceback of the broken pipe;
# any other traceback still shows.
STOPPING = threading.Event()
_TRACEBACKS = (b"Traceback (most recent call last):",
               b"PySpark daemon failed to flush the output to the worker process:")
_CLOSED_UNDER_IT = (b"BrokenPipeError", b"ConnectionResetError")


def _quiet_gateway(conf: dict[str, str]):
    """The driver's JVM, started as PySpark starts it, its output through quiet_jvm_output:
    read from before its start (a JVM that fails to start says why; one that writes much while
    starting is never held on a full pipe) to after its end (at exit, the JVM gets its stdin's
    end and is waited for, so its last lines are not lost with this process)."""
    import atexit

    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    pipes, readers = {}, []
    for fd in (1, 2):
        read_end, pipes[fd] = os.pipe()
        reader = threading.Thread(target=quiet_jvm_output, args=(os.fdopen(read_end, "rb"), fd),
                                  daemon=True, name=f"delayq-jvm-output-{fd}")
        reader.start()
        readers.append(reader)
    try:
        gateway = launch_gateway(SparkConf(loadDefaults=False).setAll(list(conf.items())),
                                 popen_kwargs={"stdout": pipes[1], "stderr": pipes[2]})
    finally:
        for write_end in pipes.values():
            os.close(write_end)

    def wait_for_the_jvm():
        try:
            gateway.proc.stdin.close()
            gateway.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for reader in readers:
            reader.join(timeout=2)
    atexit.register(wait_for_the_jvm)
    return gateway


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
        if text in QUIET_LINES or text.startswith(QUIET_PREFIXES):
            after_quiet = True
            continue
        if after_quiet and not text:
            after_quiet = False
            continue
        after_quiet = False
        _write(fd, line)
    if block and not STOPPING.is_set():   # cut off by the JVM's exit at a clean stop: dropped
        _write(fd, b"".join(block))


def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
