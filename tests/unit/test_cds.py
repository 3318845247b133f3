"""The class data archive's name follows the Java and the jars, and a missing archive adds no
JVM option (no JVM started here)."""
from __future__ import annotations

import os
import pytest

from conf import load_settings
from streaming.spark import cds
from streaming.tools import cds_train
from tests.support import fake_jars_dir


@pytest.fixture
def jars(tmp_path):
    fake_jars_dir(tmp_path / "lib", ("delta-spark_2.13-4.0.0.jar",
                                     "delta-storage-4.0.0.jar", "kafka-clients-3.9.0.jar"))
    return load_settings(jars_dir=str(tmp_path / "lib"), data_dir=str(tmp_path / "data"))


@pytest.mark.parametrize("jar", ["spark/kafka-clients-3.9.0.jar", "localfs/delayq-localfs.jar"])
def test_archive_name_changes_with_a_jar(jars, jar):
    """The archive holds the classes of every jar on the JVM's class path, the local file
    system's included: another jar must mean another archive."""
    before = cds.archive_path(jars)
    assert before is not None and before.parent == jars.jars_path / "cds"
    path = jars.jars_path / jar
    path.write_bytes(b"another jar")
    os.utime(path, (1, 1))
    assert cds.archive_path(jars) != before


def test_options_only_when_the_archive_exists(jars):
    assert cds.java_options(jars) == ""
    archive = cds.archive_path(jars)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    options = cds.java_options(jars)
    assert f"-XX:SharedArchiveFile={archive}" in options and "-Xshare:auto" in options
    from streaming.spark.session import spark_conf
    assert options in spark_conf(jars)["spark.driver.extraJavaOptions"]


def test_no_jars_means_no_options(tmp_path):
    settings = load_settings(jars_dir=str(tmp_path / "none"), data_dir=str(tmp_path / "data"))
    assert cds.java_options(settings) == ""


def test_a_new_archive_removes_the_stale_ones_and_nothing_else(jars):
    archive = cds.archive_path(jars)
    archive.parent.mkdir(parents=True)
    stale = archive.parent / "spark-0123456789abcdef.jsa"
    partial = archive.parent / "spark-fedcba9876543210.partial"
    for path in (archive, stale, partial):
        path.write_bytes(b"archive")
    cds_train.remove_stale(archive)
    assert archive.is_file() and partial.is_file() and not stale.exists()
