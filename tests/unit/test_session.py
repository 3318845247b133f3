"""Spark settings that are ours to choose, checked without starting a JVM."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pyspark

import pytest

from conf import load_settings
from state.errors import ConfigError
from streaming.spark.session import (FILE_SYSTEM_CHECKPOINTS, LOCAL_FS_CLASS, PYTHON_UNIX_SOCKET,
                               spark_conf)
from tests.support import fake_jars_dir

PROJECT = Path(__file__).resolve().parents[2]


def _settings(tmp_path):
    fake_jars_dir(tmp_path / "lib")
    return load_settings(jars_dir=str(tmp_path / "lib"), data_dir=str(tmp_path / "data"))


def test_checkpoint_files_are_renamed_through_the_file_system_api(tmp_path):
    """The checkpoint manager named in the settings is a class of the Spark we run: a name
    Spark cannot load fails the first batch, so a Spark upgrade that moves it must fail here."""
    conf = spark_conf(_settings(tmp_path))
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == FILE_SYSTEM_CHECKPOINTS

    jars = Path(pyspark.__file__).parent / "jars"
    entry = FILE_SYSTEM_CHECKPOINTS.replace(".", "/") + ".class"
    holders = [jar.name for jar in jars.glob("spark-sql_*.jar")
               if entry in zipfile.ZipFile(jar).namelist()]
    assert holders, f"{FILE_SYSTEM_CHECKPOINTS} is in no spark-sql jar of {jars}"


def test_the_python_workers_socket_is_a_setting_this_spark_knows(tmp_path):
    """Spark ignores a key it does not define: the Unix socket setting must be one that the
    spark-core jar we run declares, or the workers would be back on loopback TCP unnoticed."""
    assert spark_conf(_settings(tmp_path))[PYTHON_UNIX_SOCKET] == "true"
    jars = Path(pyspark.__file__).parent / "jars"
    declared = [jar.name for jar in jars.glob("spark-core_*.jar")
                if PYTHON_UNIX_SOCKET.encode() in zipfile.ZipFile(jar).read(
                    "org/apache/spark/internal/config/Python$.class")]
    assert declared, f"{PYTHON_UNIX_SOCKET} is declared in no spark-core jar of {jars}"


def test_the_local_file_system_is_ours_and_on_the_class_path_from_the_start(tmp_path):
    """Hadoop resolves fs.file.impl at its first file: path, before spark.jars are loaded: the
    jar must be on the driver's and the executors' class path, not only in spark.jars."""
    settings = _settings(tmp_path)
    conf = spark_conf(settings)
    jar = str(settings.jars_path / "localfs" / "delayq-localfs.jar")
    assert conf["spark.hadoop.fs.file.impl"] == LOCAL_FS_CLASS
    assert conf["spark.driver.extraClassPath"] == jar
    assert conf["spark.executor.extraClassPath"] == jar


def test_a_missing_local_file_system_jar_says_how_to_build_it(tmp_path):
    (fake_jars_dir(tmp_path / "lib") / "localfs" / "delayq-localfs.jar").unlink()
    settings = load_settings(jars_dir=str(tmp_path / "lib"), data_dir=str(tmp_path / "data"))
    with pytest.raises(ConfigError, match="deploy/setup.sh"):
        spark_conf(settings)


def test_the_class_named_is_the_class_the_source_defines():
    """The name in the settings and the Java source agree (the jar is built from it)."""
    package, _, name = LOCAL_FS_CLASS.rpartition(".")
    source = (PROJECT / "deploy" / "maven" / "localfs" / "src" / "main" / "java"
              / package.replace(".", "/") / f"{name}.java").read_text()
    assert f"package {package};" in source
    assert f"public class {name} extends LocalFileSystem" in source


def test_a_submitted_job_has_it_on_the_class_paths_too(tmp_path):
    """Under spark-submit the driver JVM starts before the job's session sets anything."""
    from streaming.spark.submit import submit_command

    settings = _settings(tmp_path)
    jar = str(settings.jars_path / "localfs" / "delayq-localfs.jar")
    command = submit_command(settings, "local[1]")
    assert command[command.index("--driver-class-path") + 1] == jar
    assert f"spark.executor.extraClassPath={jar}" in command
    # So do the log4j2 configuration and the stack size spark_conf gives the driver's JVM.
    from streaming.spark.session import DRIVER_STACK_OPTION, LOG4J_OPTION, spark_conf
    options = command[command.index("--driver-java-options") + 1].split()
    assert options == [LOG4J_OPTION, DRIVER_STACK_OPTION]
    assert set(options) <= set(spark_conf(settings)["spark.driver.extraJavaOptions"].split())


def test_local_star_gives_the_wheel_dispatch_and_ledger_their_own_slots():
    from streaming.spark.session import spark_master

    cores = os.cpu_count() or 1
    settings = load_settings(spark_master="local[*]", ready_partitions=3,
                             spark_shuffle_partitions=1)
    assert spark_master(settings) == f"local[{max(cores, 1) + 3 + 3}]"
    assert spark_master(load_settings(spark_master="local[3]")) == "local[3]"


def test_the_jvm_output_keeps_everything_but_a_healthy_runs_notices(tmp_path):
    import io

    from streaming.spark.session import quiet_jvm_output

    jvm = io.BytesIO(
        b"WARNING: Using incubator modules: jdk.incubator.vector\n"
        b"\n"
        b"\n"
        b"21:00:30 ERROR TaskSetManager: Task 0 in stage 3.0 failed 1 times\n"
        b"Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n"
        b"WARNING: Using incubator modules: jdk.incubator.vector, jdk.other\n"
        b"no newline at the end")
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    quiet_jvm_output(jvm, fd)
    os.close(fd)
    assert out.read_bytes() == (
        b"\n"
        b"21:00:30 ERROR TaskSetManager: Task 0 in stage 3.0 failed 1 times\n"
        b"Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n"
        b"WARNING: Using incubator modules: jdk.incubator.vector, jdk.other\n"
        b"no newline at the end")


def test_a_workers_broken_pipe_is_dropped_only_once_a_clean_stop_began(tmp_path):
    import io

    from streaming.spark.session import STOPPING, quiet_jvm_output

    broken = (b"Traceback (most recent call last):\n"
              b'  File "/x/pyspark.zip/pyspark/daemon.py", line 233, in manager\n'
              b'  File "/x/pyspark.zip/pyspark/daemon.py", line 87, in worker\n'
              b"BrokenPipeError: [Errno 32] Broken pipe\n")
    other = (b"Traceback (most recent call last):\n"
             b'  File "/x/pyspark.zip/pyspark/worker.py", line 3, in main\n'
             b"    raise ValueError(x)\n"
             b"ValueError: a real fault\n")

    def through(data: bytes) -> bytes:
        out = tmp_path / "out"
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        quiet_jvm_output(io.BytesIO(data), fd)
        os.close(fd)
        return out.read_bytes()

    try:
        assert through(broken + b"after\n") == broken + b"after\n", "running: a real fault"
        assert through(broken[:60]) == broken[:60], "cut off while running: kept"
        STOPPING.set()
        assert through(broken + b"after\n") == b"after\n"
        assert through(other + broken) == other
        assert through(b"Traceback (most recent call last):\n") == b"", \
            "cut off by the JVM's exit at a clean stop"
    finally:
        STOPPING.clear()
