"""The jars deploy/setup.sh resolves with Maven: Spark's connectors (`spark/`), delayq's
Hadoop local file system (`localfs/`) and S3A for a store on S3 (`s3/`)."""
from __future__ import annotations

from pathlib import Path

from conf.settings import Settings
from state.errors import ConfigError

# Jars the job cannot run without; the rest of .lib/spark are their runtime dependencies.
CONNECTOR = "spark-sql-kafka-0-10_2.13-"
REQUIRED_JARS = (CONNECTOR, "delta-spark_", "kafka-clients-")


def spark_jars(settings: Settings) -> list[Path]:
    """Refused when a required jar is missing or the Kafka connector was built for another Spark
    than pyspark's: Spark's internals change between releases."""
    folder = settings.jars_path / "spark"
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    for prefix in REQUIRED_JARS:
        if not any(jar.name.startswith(prefix) for jar in jars):
            raise ConfigError(
                f"no {prefix}*.jar in {folder}; run deploy/setup.sh once to resolve the "
                f"Spark jars with Maven (or set DELAYQ_JARS_DIR to a folder holding spark/)"
            )
    from pyspark import __version__ as spark_version

    connector = next(j.name for j in jars if j.name.startswith(CONNECTOR))
    if connector != f"{CONNECTOR}{spark_version}.jar":
        raise ConfigError(
            f"{folder / connector} is not the Kafka connector of pyspark {spark_version}: "
            f"resolve the jars of deploy/maven/spark/pom.xml again (deploy/setup.sh does; "
            f"an image: build it again)")
    return jars


def s3_jars(settings: Settings) -> list[Path]:
    """S3A and the SDK modules it calls; refused when missing or built for another Hadoop than
    the client pyspark ships (S3A calls Hadoop's internals)."""
    folder = settings.jars_path / "s3"
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    aws = next((jar.name for jar in jars if jar.name.startswith("hadoop-aws-")), None)
    if aws is None:
        raise ConfigError(f"no hadoop-aws-*.jar in {folder} for the s3a:// store; run "
                          f"deploy/setup.sh once to resolve deploy/maven/s3/pom.xml with Maven")
    client = next(spark_home().glob("jars/hadoop-client-api-*.jar"), None)
    hadoop = client.name.removeprefix("hadoop-client-api-") if client else None
    if hadoop is not None and aws != f"hadoop-aws-{hadoop}":
        raise ConfigError(f"{folder / aws} is not the S3A of pyspark's Hadoop "
                          f"({hadoop.removesuffix('.jar')}): set hadoop.version in "
                          f"deploy/maven/s3/pom.xml to it and run deploy/setup.sh again")
    return jars


def local_fs_jar(settings: Settings) -> Path:
    jar = settings.jars_path / "localfs" / "delayq-localfs.jar"
    if not jar.is_file():
        raise ConfigError(
            f"no {jar}; run deploy/setup.sh once to build it with Maven "
            f"(or set DELAYQ_JARS_DIR to a folder holding localfs/)"
        )
    return jar


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent
