"""delayq's local file system (deploy/maven/localfs) sets file modes without a child process.

Hadoop's own local file system, without its native library, runs `chmod` for every file and
directory it creates. The probe below does what Spark's checkpoint writer does, in a JVM whose
PATH has no `chmod`: Hadoop's class fails there (the control: it shows the probe really needs
the program), delayq's class succeeds and leaves the same modes Hadoop would set.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pyspark
import pytest

from conf import load_settings
from streaming.spark.cds import _java
from streaming.spark.jars import local_fs_jar
from streaming.spark.session import LOCAL_FS_CLASS

PROBE = Path(__file__).resolve().parent / "java" / "LocalFsProbe.java"


def _probe(fs_class: str, folder: Path) -> subprocess.CompletedProcess:
    java = _java()
    if java is None:
        pytest.fail("no java on this machine; deploy/setup.sh needs one")
    jars = Path(pyspark.__file__).parent / "jars"
    class_path = os.pathsep.join([str(local_fs_jar(load_settings())), f"{jars}/*"])
    empty = folder / "bin"          # a PATH with no programs at all
    empty.mkdir()
    return subprocess.run([str(java), "-cp", class_path, str(PROBE), fs_class, str(folder)],
                          env={"PATH": str(empty), "JAVA_HOME": str(java.parent.parent)},
                          capture_output=True, text=True, timeout=120)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_hadoop_s_own_class_needs_a_chmod_process(tmp_path):
    done = _probe("org.apache.hadoop.fs.LocalFileSystem", tmp_path)
    assert done.returncode != 0, done.stdout
    assert "chmod" in done.stderr, done.stderr[-2000:]


def test_delayq_s_class_sets_the_same_modes_without_one(tmp_path):
    done = _probe(LOCAL_FS_CLASS, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"class={LOCAL_FS_CLASS}" in done.stdout
    made = tmp_path / "made"
    assert _mode(made) == 0o750
    assert _mode(made / "created") == 0o640            # 0666 under the umask 027
    assert _mode(made / ".created.crc") == 0o640
    assert (made / "created").read_bytes() == b"\x01\x02\x03"
    assert _mode(made / "changed") == 0o600


def test_the_job_s_session_uses_it(spark, test_settings):
    """The session every integration test runs on resolves file: paths to delayq's class,
    the checkpoint and table folders included."""
    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    data = jvm.org.apache.hadoop.fs.Path(test_settings.data_path.as_uri())
    assert local.getClass().getName() == LOCAL_FS_CLASS
    assert data.getFileSystem(conf).getClass().getName() == LOCAL_FS_CLASS


def test_modes_java_nio_cannot_set_still_go_through_hadoop_s_way(spark, tmp_path):
    """The sticky bit (and setuid, setgid) fall back to Hadoop's own code, in the job's JVM,
    whose PATH has `chmod`."""
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
    folder = tmp_path / "shared"
    folder.mkdir()
    path = jvm.org.apache.hadoop.fs.Path(folder.as_uri())
    fs.setPermission(path, jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o1770))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1770
    fs.setPermission(path, jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o750))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750
