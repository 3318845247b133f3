"""The data location: checkpoints and Delta tables on local disk or a store (HDFS, S3), and
delayq's small files in a checkpoint. `path` gives a `Path`, or a `HadoopPath` answering through
the Spark driver's Hadoop client (the file system and credentials of Spark's own checkpoint)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from state.errors import DelayqError

# What a store's refusal says (S3A's exceptions, AWS's error codes) and the fix to name.
_REFUSALS = (
    (("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"),
     "it refused this job's credentials: check s3_access_key and s3_secret_key "
     "(DELAYQ_S3_ACCESS_KEY, DELAYQ_S3_SECRET_KEY) or the role's policy"),
    (("NoSuchBucket", "UnknownStoreException"),
     "its bucket does not exist: create it (`delayq s3 start` creates the store's bucket on "
     "its local server) or fix DELAYQ_STORE"),
)


class StoreError(DelayqError):
    """The store cannot be reached, or refuses this job; the message names the fix."""


def check_reachable(root: str) -> None:
    """Refuse a store this job cannot read, with the reason and the fix, before anything is
    written there (a local folder: nothing to check)."""
    if is_local(root):
        return
    try:
        path(root).exists()
    except Exception as exc:   # py4j's error holds the Java exception's text
        text = str(exc)
        fix = next((fix for needles, fix in _REFUSALS if any(n in text for n in needles)), None)
        said = next((line for line in text.splitlines() if "Exception" in line), text)
        raise StoreError(f"the store {root} cannot be used: "
                         f"{fix or said.strip()[:300]}") from None


def jvm(spark_or_context):
    """The Spark driver's JVM, for what PySpark has no public API for: Hadoop's file systems
    (`HadoopPath`) and the query thread's wait at a stop (streaming/wheel/query.py)."""
    context = getattr(spark_or_context, "sparkContext", spark_or_context)
    return context._jvm


def is_local(location: str | Path) -> bool:
    """A folder on this machine (a plain path or a file: URI), not on a store."""
    text = str(location)
    return "://" not in text or text.startswith("file:")


def path(location: str | Path) -> Path | HadoopPath:
    if isinstance(location, (Path, HadoopPath)):
        return location
    if is_local(location):
        return Path(location.removeprefix("file://").removeprefix("file:"))
    return HadoopPath(location.rstrip("/"))


def object_store_options(settings) -> dict[str, str]:
    """delta-rs's options (object_store's) for the tables of an s3a:// store, from the same
    settings as S3A's (streaming/spark/session.py s3_conf); {} for any other."""
    if not settings.store.strip().startswith("s3a://"):
        return {}
    options = {"AWS_REGION": settings.s3_region,
               "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not settings.s3_path_style).lower()}
    if settings.s3_endpoint:
        options["AWS_ENDPOINT_URL"] = settings.s3_endpoint
        options["AWS_ALLOW_HTTP"] = str(settings.s3_endpoint.startswith("http://")).lower()
    if settings.s3_access_key:
        options["AWS_ACCESS_KEY_ID"] = settings.s3_access_key
        options["AWS_SECRET_ACCESS_KEY"] = settings.s3_secret_key.get_secret_value()
    return options


def write_atomic(target: Path | HadoopPath, text: str) -> None:
    """Replace `target`'s content by `text` in one step: a reader sees the old or the new
    file, never a part (a crash while writing leaves the old one)."""
    if isinstance(target, HadoopPath):
        target.write_atomic(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


@dataclass(frozen=True)
class HadoopPath:
    """A file or folder on a Hadoop file system, read and written from the driver."""

    uri: str   # without a trailing slash

    def __truediv__(self, name: str) -> HadoopPath:
        return HadoopPath(f"{self.uri}/{name}")

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]

    @property
    def parent(self) -> HadoopPath:
        return HadoopPath(self.uri.rsplit("/", 1)[0])

    def _fs(self):
        """The path's Hadoop file system, with the settings and credentials Spark reads it with."""
        from pyspark.sql import SparkSession

        java = jvm(SparkSession.active())
        conf = java.org.apache.spark.SparkContext.getOrCreate().hadoopConfiguration()
        jpath = java.org.apache.hadoop.fs.Path(self.uri)
        return java, conf, jpath.getFileSystem(conf), jpath

    def exists(self) -> bool:
        _, _, fs, jpath = self._fs()
        return bool(fs.exists(jpath))

    def is_dir(self) -> bool:
        _, _, fs, jpath = self._fs()
        return bool(fs.exists(jpath) and fs.getFileStatus(jpath).isDirectory())

    def iterdir(self) -> list[HadoopPath]:
        _, _, fs, jpath = self._fs()
        return [self / status.getPath().getName() for status in fs.listStatus(jpath)]

    def newest_ms(self) -> int | None:
        """When the newest entry of this folder was written (epoch ms; None: none, or no folder)."""
        _, _, fs, jpath = self._fs()
        if not fs.exists(jpath):
            return None
        return max((int(status.getModificationTime()) for status in fs.listStatus(jpath)),
                   default=None)

    def read_text(self) -> str:
        _, _, fs, jpath = self._fs()
        if not fs.exists(jpath):
            raise FileNotFoundError(self.uri)
        stream = fs.open(jpath)
        try:
            return bytes(stream.readAllBytes()).decode()   # py4j hands a byte[] over as bytes
        finally:
            stream.close()

    def write_atomic(self, text: str) -> None:
        """Written beside, then renamed over the target with Hadoop's FileContext (an atomic
        rename on HDFS). On S3 a rename that replaces deletes the target first, then copies:
        a crash between leaves no file; one object written whole (a single PUT, visible at its
        close) replaces it in one step."""
        jvm, conf, fs, jpath = self._fs()
        if self.uri.startswith("s3a://"):
            out = fs.create(jpath, True)
            try:
                out.write(text.encode())
            finally:
                out.close()
            return
        tmp = jvm.org.apache.hadoop.fs.Path(f"{self.parent.uri}/.{self.name}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(text.encode())
        finally:
            out.close()
        rename = jvm.org.apache.hadoop.fs.Options.Rename
        options = jvm.java.lang.reflect.Array.newInstance(rename.OVERWRITE.getClass(), 1)
        options[0] = rename.OVERWRITE
        jvm.org.apache.hadoop.fs.FileContext.getFileContext(jpath.toUri(), conf) \
            .rename(tmp, jpath, options)
