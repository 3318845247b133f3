"""The JVM jars deploy/setup.sh resolves with Maven into the jars folder: Spark's connectors and
their dependencies (`spark/`), and delayq's Hadoop local file system (`localfs/`)."""
from __future__ import annotations

from pathlib import Path

from conf.settings import Settings
from state.errors import ConfigError

# Jars the job cannot run without; the rest of .lib/spark are their runtime dependencies.
REQUIRED_JARS = ("spark-sql-kafka-0-10_2.13-", "delta-spark_", "kafka-clients-")


def spark_jars(settings: Settings) -> list[Path]:
    folder = settings.jars_path / "spark"
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    for prefix in REQUIRED_JARS:
        if not any(jar.name.startswith(prefix) for jar in jars):
            raise ConfigError(
                f"no {prefix}*.jar in {folder}; run deploy/setup.sh once to resolve the "
                f"Spark jars with Maven (or set DELAYQ_JARS_DIR to a folder holding spark/)"
            )
    return jars


def local_fs_jar(settings: Settings) -> Path:
    jar = settings.jars_path / "localfs" / "delayq-localfs.jar"
    if not jar.is_file():
        raise ConfigError(
            f"no {jar}; run deploy/setup.sh once to build it with Maven "
            f"(or set DELAYQ_JARS_DIR to a folder holding localfs/)"
        )
    return jar
