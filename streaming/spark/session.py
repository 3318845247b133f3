"""The one place Spark is configured (from conf/; callers may add `extra` settings for one
session): master, jars, RocksDB state, Delta, Python workers."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

from conf.settings import CONF_DIR, Settings
from streaming.spark import cds
from streaming.spark.jars import local_fs_jar, s3_jars, spark_jars

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILE_SYSTEM_CHECKPOINTS = ("org.apache.spark.sql.execution.streaming.checkpointing."
                           "FileSystemBasedCheckpointFileManager")
# Spark's checkpoint file manager for object stores (spark-hadoop-cloud, in .lib/s3): each
# checkpoint file is written as one object when its stream closes, never renamed into place.
OBJECT_STORE_CHECKPOINTS = ("org.apache.spark.internal.io.cloud."
                            "AbortableStreamBasedCheckpointFileManager")
# Hadoop's local file system with file modes set in the JVM (deploy/maven/localfs).
LOCAL_FS_CLASS = "io.delayq.hadoop.NioLocalFileSystem"
PYTHON_UNIX_SOCKET = "spark.python.unix.domain.socket.enabled"
LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{CONF_DIR / 'log4j2.properties'}"
# A query stopped mid-batch fails its foreachBatch call; Spark then matches the long Python
# traceback with a backtracking regex that overflows the default 1 MiB stack.
DRIVER_STACK_OPTION = "-Xss16m"


def spark_master(settings: Settings) -> str:
    """`local[*]` becomes a slot per core (at least one per state partition) for the wheel, plus
    one per dispatch task (held for good) and per ledger partition, so the wheel never waits."""
    if settings.spark_master != "local[*]":
        return settings.spark_master
    cores = max(os.cpu_count() or 1, settings.spark_shuffle_partitions)
    return f"local[{cores + 2 * (settings.ready_partitions or 2)}]"


ENGINE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Otherwise Spark reads a key's whole value before each write only to count keys.
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Snapshot rebuild tasks per commit (default 50): a few thousand log actions, fastest in one.
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.metricsEnabled": "true",
    # Spark's default less "kafka", so Kafka goes through the V2 writer: on V1 an Observation
    # (sinks/ready.py) waits forever for its metrics (internal conf; still so on Spark 4.2.0).
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # One worker pool, not a daemon per env: only some runners set SPARK_SIMPLIFIED_TRACEBACK.
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    # On loopback TCP neither side sets TCP_NODELAY, and each idled waiting on the other.
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
        "spark.driver.extraJavaOptions":
            f"{LOG4J_OPTION} {DRIVER_STACK_OPTION} {cds.java_options(settings)}".rstrip(),
        "spark.executor.extraJavaOptions": LOG4J_OPTION,
        # Without Hadoop's native library its local file system forks `chmod` per new file; this
        # one uses java.nio. It is resolved before spark.jars load, hence the class path.
        "spark.hadoop.fs.file.impl": LOCAL_FS_CLASS,
        "spark.driver.extraClassPath": local_fs,
        "spark.executor.extraClassPath": local_fs,
        "spark.sql.warehouse.dir": str(settings.data_path / "warehouse"),
        "spark.metrics.conf": str(CONF_DIR / "spark-metrics.properties"),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
    }
    if settings.store.strip().startswith("s3a://"):
        conf.update(s3_conf(settings))
        conf["spark.jars"] += "," + ",".join(str(jar) for jar in s3_jars(settings))
    if settings.spark_shuffle_partitions:   # 0: sized at the job's start (wheel/sizing.py)
        conf["spark.sql.shuffle.partitions"] = str(settings.spark_shuffle_partitions)
    if not settings.store.strip():
        # The default renames through Hadoop's FileContext, forking `readlink` per path; this
        # uses rename(2) (internal conf; c99d83f: lateness p99 2.9-4.5 s instead of 4.2-5.9 s).
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FILE_SYSTEM_CHECKPOINTS
    conf.update(extra or {})
    return conf


def s3_conf(settings: Settings) -> dict[str, str]:
    """S3A's settings for an s3a:// store (conf/defaults.toml's s3_*)."""
    conf = {
        "spark.sql.streaming.checkpointFileManagerClass": OBJECT_STORE_CHECKPOINTS,
        "spark.hadoop.fs.s3a.endpoint.region": settings.s3_region,
        "spark.hadoop.fs.s3a.path.style.access": str(settings.s3_path_style).lower(),
        # S3A 3.5 sends the AWS SDK's newer checksums, which S3-compatible servers refuse (501),
        # and a bulk delete carries one; an MD5 header is what they all take.
        "spark.hadoop.fs.s3a.checksum.generation": "false",
        "spark.hadoop.fs.s3a.request.md5.header": "true",
    }
    if settings.s3_endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.s3_endpoint
        if settings.s3_endpoint.startswith("http://"):
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    if settings.s3_access_key:
        conf.update({
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "spark.hadoop.fs.s3a.access.key": settings.s3_access_key,
            "spark.hadoop.fs.s3a.secret.key": settings.s3_secret_key.get_secret_value()})
    return conf


def build_session(settings: Settings, extra: dict[str, str] | None = None):
    if settings.spark_master.startswith("local"):
        # Keep a local job on loopback instead of whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers import the project's packages without installing them.
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


# What the driver's JVM prints outside log4j on every healthy run.
QUIET_LINES = (b"WARNING: Using incubator modules: jdk.incubator.vector",)
# Set when a clean stop begins: from then on, a worker's broken-pipe traceback is dropped.
STOPPING = threading.Event()
_TRACEBACKS = (b"Traceback (most recent call last):",
               b"PySpark daemon failed to flush the output to the worker process:")
_CLOSED_UNDER_IT = (b"BrokenPipeError", b"ConnectionResetError")
# Where the JVM's stdout (1) and stderr (2) go: copies of ours while it starts, then fd 1 and 2.
_OUT: dict[int, int] = {}


@contextlib.contextmanager
def _jvm_output_quieted():
    """While the JVM starts, stdout and stderr are pipes read by quiet_jvm_output, which the JVM
    keeps; this process gets its own back after. Once a process (PySpark keeps its JVM)."""
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
    """Copy the JVM's output to descriptor `fd`, less the lines above; never stops reading, or
    the JVM would block on a full pipe."""
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
