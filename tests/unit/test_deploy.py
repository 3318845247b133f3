"""The Kubernetes, Docker and Compose files agree with the project: image and versions,
jars, the main file, configuration keys, secrets and ports. Checked by parsing (no cluster,
no Docker engine needed)."""
from __future__ import annotations

import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from conf import load_settings
from conf.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
DEFAULTS = load_settings()


def pinned(package: str) -> str:
    spec = next(d for d in PROJECT["dependencies"] if d.startswith(package + "=="))
    return spec.split("==")[1].split(";")[0].strip()


def pom_property(part: str, name: str) -> str:
    text = (DEPLOY / "maven" / part / "pom.xml").read_text()
    return re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", text).group(1)


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def setting_keys(env: dict[str, str]) -> set[str]:
    return {k.removeprefix("DELAYQ_").lower() for k in env if k.startswith("DELAYQ_")}


@pytest.fixture(scope="module")
def k8s():
    resources = docs(DEPLOY / "k8s" / "configmap.yaml") + docs(DEPLOY / "k8s" / "sparkapplication.yaml")
    return {(r["kind"], r["metadata"]["name"]): r for r in resources}


def test_spark_application_runs_this_image_version_and_main_file(k8s):
    app = k8s[("SparkApplication", "delayq")]["spec"]
    assert app["image"] == f"delayq:{VERSION}"
    assert app["sparkVersion"] == pinned("pyspark")
    main = app["mainApplicationFile"].removeprefix("local:///opt/delayq/")
    assert (ROOT / main).is_file(), main
    assert app["restartPolicy"]["type"] in ("Always", "OnFailure")
    provider = app["sparkConf"]["spark.sql.streaming.stateStore.providerClass"]
    from streaming.spark.session import LOCAL_FS_CLASS, ROCKSDB_PROVIDER
    assert provider == ROCKSDB_PROVIDER
    # The local file system: named, and on the driver's class path where the image has it.
    assert app["sparkConf"]["spark.hadoop.fs.file.impl"] == LOCAL_FS_CLASS
    assert app["sparkConf"]["spark.driver.extraClassPath"] == \
        "/opt/delayq/.lib/localfs/delayq-localfs.jar"
    # The driver's JVM options `delayq run` gives it, with the image's conf folder.
    from streaming.spark.session import CONF_DIR, DRIVER_STACK_OPTION, LOG4J_OPTION
    assert app["sparkConf"]["spark.driver.extraJavaOptions"].split() == [
        LOG4J_OPTION.replace(str(CONF_DIR), "/opt/delayq/conf"), DRIVER_STACK_OPTION]


def test_kubernetes_settings_are_settings_and_secrets_stay_in_the_secret(k8s):
    config = k8s[("ConfigMap", "delayq-config")]["data"]
    secret = k8s[("Secret", "delayq-secrets")]["stringData"]
    assert setting_keys(config) <= set(Settings.model_fields), setting_keys(config) - set(Settings.model_fields)
    assert setting_keys(secret) <= set(Settings.model_fields)
    assert not {k for k in config if "PASSWORD" in k}, "no secret in the ConfigMap"
    load_settings(**{k: v for k, v in ((k.removeprefix("DELAYQ_").lower(), v)
                                       for k, v in {**config, **secret}.items())})
    app = k8s[("SparkApplication", "delayq")]["spec"]
    for role in ("driver", "executor"):
        refs = app[role]["envFrom"]
        assert {"configMapRef": {"name": "delayq-config"}} in refs
        assert {"secretRef": {"name": "delayq-secrets"}} in refs
        assert any(m["mountPath"] == config["DELAYQ_DATA_DIR"] for m in app[role]["volumeMounts"])
    claim = app["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in k8s
    assert k8s[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_metrics_port_and_scrape_annotations_agree(k8s):
    config = k8s[("ConfigMap", "delayq-config")]["data"]
    driver = k8s[("SparkApplication", "delayq")]["spec"]["driver"]
    port = int(config["DELAYQ_METRICS_PORT"])
    assert port == DEFAULTS.metrics_port
    assert config["DELAYQ_METRICS_HOST"] == "0.0.0.0", "reachable from the scraper"
    assert driver["annotations"]["prometheus.io/port"] == str(port)
    assert driver["annotations"]["prometheus.io/scrape"] == "true"
    assert {"name": "metrics", "protocol": "TCP", "containerPort": port} in driver["ports"]


def test_dockerfile_bakes_in_the_code_the_jars_and_the_entrypoint():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    for package in ("conf", "state", "streaming", "sinks"):
        assert f"COPY {package} {package}" in text
    for part in ("spark", "kafka", "localfs"):
        assert f"deploy/maven/{part}/pom.xml" in text and (DEPLOY / "maven" / part / "pom.xml").is_file()
    assert "/jars/localfs/" in text         # where the driver's class path and the entrypoint look
    assert "DELAYQ_JARS_DIR=/opt/delayq/.lib" in text and "COPY --from=jars /jars /opt/delayq/.lib" in text
    assert "COPY deploy/spark deploy/spark" in text
    assert re.search(r"EXPOSE .*\b%d\b" % DEFAULTS.metrics_port, text)
    assert "python:3.11" in text and "openjdk-17" in text


def test_entrypoint_starts_executors_with_a_class_pyspark_ships():
    script = DEPLOY / "docker" / "entrypoint.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    # The driver's spark-submit under the supervisor that makes a SIGTERM a clean stop
    # (tests/faults/test_stop.py runs it through `delayq submit`).
    assert re.search(r"driver\)\n(.*\n)*?\s*exec \S+ -m streaming\.spark\.supervise \\\n\s*\S*/bin/spark-submit",
                     text), "the driver branch runs spark-submit under streaming.spark.supervise"
    assert "${DELAYQ_JARS_DIR}/localfs/*" in text    # executors resolve fs.file.impl too
    backend = re.search(r"org\.apache\.spark\.scheduler\.cluster\.k8s\.(\w+)", text).group(0)
    from streaming.spark.jars import spark_home
    jar = next((spark_home() / "jars").glob("spark-kubernetes_*.jar"))
    with zipfile.ZipFile(jar) as archive:
        assert backend.replace(".", "/") + ".class" in archive.namelist()


def test_compose_agrees_with_the_project():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"]
    job = compose["delayq"]
    assert job["image"] == f"delayq:{VERSION}"
    assert (DEPLOY / "compose" / job["build"]["context"] / job["build"]["dockerfile"]).is_file()
    assert setting_keys(job["environment"]) <= set(Settings.model_fields)
    port = int(job["environment"]["DELAYQ_METRICS_PORT"])
    assert port == DEFAULTS.metrics_port and f"{port}:{port}" in job["ports"]
    bootstrap = job["environment"]["DELAYQ_BOOTSTRAP_SERVERS"]
    kafka = compose["kafka"]
    assert kafka["image"] == f"apache/kafka:{pom_property('kafka', 'kafka.version')}"
    assert f"PLAINTEXT://{bootstrap}" == kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    scrape = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    targets = {t for job_ in scrape["scrape_configs"] for c in job_["static_configs"] for t in c["targets"]}
    assert f"delayq:{port}" in targets
    for mount in compose["grafana"]["volumes"]:
        source = mount.split(":")[0]
        assert (DEPLOY / "compose" / source).is_dir(), source
    datasource = yaml.safe_load(next((DEPLOY / "grafana" / "provisioning" / "datasources").glob("*.y*ml")).read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
