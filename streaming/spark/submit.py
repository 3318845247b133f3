"""`delayq submit --master spark://host:7077`: the job through spark-submit, the packages zipped
for --py-files; settings reach the driver through the DELAYQ_* environment."""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from conf.settings import PROJECT_ROOT, Settings
from streaming.spark import supervise
from streaming.cli.arguments import PACKAGES
from streaming.spark.jars import local_fs_jar, spark_home, spark_jars
from streaming.spark.session import DRIVER_STACK_OPTION, LOG4J_OPTION


def build_zip(settings: Settings) -> Path:
    target = settings.data_path / "dist" / "delayq-py.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for path in sorted((PROJECT_ROOT / package).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(PROJECT_ROOT).as_posix())
    tmp.replace(target)
    return target


def submit_command(settings: Settings, master: str, deploy_mode: str = "client",
                   total_cores: int | None = None, run_args: list[str] | None = None) -> list[str]:
    local_fs = str(local_fs_jar(settings))
    command = [
        str(spark_home() / "bin" / "spark-submit"), "--master", master,
        "--deploy-mode", deploy_mode, "--name", settings.spark_app_name,
        "--jars", ",".join(str(j) for j in spark_jars(settings)),
        # The local file system class must be on the JVMs' class path from their start.
        "--driver-class-path", local_fs,
        # The driver's JVM starts before the session: its options (spark_conf's in `run`) go here.
        "--driver-java-options", f"{LOG4J_OPTION} {DRIVER_STACK_OPTION}",
        "--conf", f"spark.executor.extraClassPath={local_fs}",
        "--py-files", str(build_zip(settings)),
        "--driver-memory", settings.spark_driver_memory,
        "--executor-memory", settings.spark_executor_memory,
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
    ]
    if total_cores:
        command += ["--total-executor-cores", str(total_cores)]
    return command + [str(PROJECT_ROOT / supervise.DRIVER_FILE), *(run_args or [])]


def submit_env(settings: Settings, master: str) -> dict[str, str]:
    env = {**os.environ, "DELAYQ_SPARK_MASTER": master, "SPARK_HOME": str(spark_home()),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    host = master.split("://", 1)[-1].split(":", 1)[0]
    if master.startswith("local") or host in ("127.0.0.1", "localhost"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def submit(settings: Settings, master: str, **kwargs) -> int:
    """spark-submit's exit code; a SIGTERM or Ctrl-C here becomes the driver's clean stop."""
    command = submit_command(settings, master, **kwargs)
    print("delayq submit:", " ".join(command), flush=True)
    return supervise.run(command, submit_env(settings, master))
