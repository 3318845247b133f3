"""The driver JVM's class data sharing archive (made by streaming.tools.cds_train), which starts
the job faster; valid only for the Java and jars it was made with, so its name digests both."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from conf.settings import Settings
from streaming.spark.jars import local_fs_jar, spark_jars


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    if home and (java := Path(home) / "bin" / "java").exists():
        return java.resolve()
    found = shutil.which("java")
    return Path(found).resolve() if found else None


def archive_path(settings: Settings) -> Path | None:
    """None without a Java."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha1()
    pyspark_jars = sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    for path in [java, *spark_jars(settings), local_fs_jar(settings), *pyspark_jars]:
        stat = path.stat()
        digest.update(f"{path}|{stat.st_size}|{int(stat.st_mtime)}\n".encode())
    return settings.jars_path / "cds" / f"spark-{digest.hexdigest()[:16]}.jsa"


def java_options(settings: Settings) -> str:
    """Driver JVM options mapping the archive, "" if none (-Xshare:auto ignores a mismatch)."""
    try:
        archive = archive_path(settings)
    except Exception:   # no jars yet: the session reports that itself
        return ""
    if archive is None or not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
