"""The stack moves in step: the pyspark and delta-spark pins (pyproject.toml), the Kafka connector
and Delta jars Maven resolves (deploy/maven/spark/pom.xml), the Hadoop API the local file system
is compiled against, and the job refuses a connector built for another Spark."""
from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conf.settings import load_settings
from state.errors import ConfigError
from streaming.spark.jars import spark_jars
from tests.support import fake_jars_dir

ROOT = Path(__file__).resolve().parents[2]
POM = {"m": "http://maven.apache.org/POM/4.0.0"}


def pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(re.fullmatch(r"([\w-]+)==([\w.]+)", d).groups() for d in deps if "==" in d)


def pom(part: str) -> ET.Element:
    return ET.parse(ROOT / "deploy" / "maven" / part / "pom.xml").getroot()


def test_the_poms_jars_are_of_the_pinned_pyspark_and_delta():
    spark = pom("spark")
    props = {p.tag.split("}")[1]: p.text for p in spark.find("m:properties", POM)}
    assert props["spark.version"] == pins()["pyspark"]
    assert props["delta.version"] == pins()["delta-spark"]
    major_minor = ".".join(pins()["pyspark"].split(".")[:2])
    artifacts = [a.text for a in spark.iterfind("m:dependencies/m:dependency/m:artifactId", POM)]
    assert f"delta-spark_{major_minor}_2.13" in artifacts


def test_the_installed_pyspark_is_the_pinned_one_and_the_local_fs_its_hadoop():
    import pyspark

    assert pyspark.__version__ == pins()["pyspark"]
    hadoop = next(Path(pyspark.__file__).parent.glob("jars/hadoop-client-api-*.jar")).name
    props = {p.tag.split("}")[1]: p.text for p in pom("localfs").find("m:properties", POM)}
    assert hadoop == f"hadoop-client-api-{props['hadoop.version']}.jar"


def test_a_connector_of_another_spark_is_refused_with_the_fix(tmp_path):
    lib = fake_jars_dir(tmp_path / "lib")
    settings = load_settings(jars_dir=str(lib))
    assert spark_jars(settings)   # the installed pyspark's connector
    connector = next((lib / "spark").glob("spark-sql-kafka-*.jar"))
    connector.rename(connector.with_name("spark-sql-kafka-0-10_2.13-4.1.1.jar"))
    with pytest.raises(ConfigError, match="resolve the jars of deploy/maven/spark/pom.xml again"):
        spark_jars(settings)
