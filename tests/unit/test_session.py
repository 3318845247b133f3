"""Spark settings that are ours to choose, checked without starting a JVM."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pyspark

from conf import load_settings
from streaming.session import FILE_SYSTEM_CHECKPOINTS, spark_conf


def test_checkpoint_files_are_renamed_through_the_file_system_api(tmp_path):
    """The checkpoint manager named in the settings is a class of the Spark we run: a name
    Spark cannot load fails the first batch, so a Spark upgrade that moves it must fail here."""
    folder = tmp_path / "lib" / "spark"
    folder.mkdir(parents=True)
    for name in ("delta-spark_2.13-4.1.0.jar", "spark-sql-kafka-0-10_2.13-4.1.1.jar",
                 "kafka-clients-3.9.1.jar"):
        (folder / name).write_bytes(b"jar")
    settings = load_settings(jars_dir=str(tmp_path / "lib"), data_dir=str(tmp_path / "data"))
    conf = spark_conf(settings)
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == FILE_SYSTEM_CHECKPOINTS

    jars = Path(pyspark.__file__).parent / "jars"
    entry = FILE_SYSTEM_CHECKPOINTS.replace(".", "/") + ".class"
    holders = [jar.name for jar in jars.glob("spark-sql_*.jar")
               if entry in zipfile.ZipFile(jar).namelist()]
    assert holders, f"{FILE_SYSTEM_CHECKPOINTS} is in no spark-sql jar of {jars}"
