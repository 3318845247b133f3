"""Builds the class data archive of streaming/spark/cds.py (run by deploy/setup.sh): a training JVM
runs the kinds of work a delayq batch does and writes the classes it loaded when it exits.

    python -m streaming.tools.cds_train    # build the archive for these settings, if missing
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conf.settings import Settings
from streaming.spark.cds import archive_path


def _train(settings: Settings, out: Path) -> None:
    """In a JVM that writes its loaded classes to `out` at exit: the kinds of work a delayq
    batch does (stateful streaming with RocksDB and pandas state, Arrow UDFs, Delta)."""
    from pyspark import SparkContext

    from streaming.spark.session import build_session, spark_conf

    work = Path(tempfile.mkdtemp(prefix="cds-train-"))
    options = " ".join(o for o in spark_conf(settings)["spark.driver.extraJavaOptions"].split()
                       if not o.startswith(("-XX:SharedArchiveFile", "-Xshare", "-Xlog:cds")))
    spark = build_session(settings, {
        "spark.driver.extraJavaOptions":
            f"{options} -XX:ArchiveClassesAtExit={out} -Xlog:cds=off -Xlog:cds+dynamic=off",
        "spark.ui.enabled": "false"})
    try:
        from pyspark.sql import functions as F

        from sinks.kafka import sent_schema
        from streaming.stages import rules_of, wheel_config_of
        from streaming.wheel.query import wheel_stream
        from streaming.wheel.writer import kept
        from streaming.wheel.schema import WHEEL_OUT_SPARK

        source = _training_source(spark)
        schema = sent_schema(WHEEL_OUT_SPARK)

        def sink(batch, batch_id):
            batch, release = kept(batch)
            (batch.filter(F.col("kind").isin("deliver", "dead"))
             .withColumn("sent_ms", F.unix_millis(F.current_timestamp()))
             .select([field.name for field in schema.fields])
             .write.format("delta").mode("append").save(str(work / "sent")))
            release()

        query = (wheel_stream(source, rules_of(settings, ""), wheel_config_of(settings))
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(work / "ckpt"))
                 .trigger(processingTime="1 second").start())
        import time
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and query.isActive and (
                query.lastProgress is None or query.lastProgress["batchId"] < 9):
            time.sleep(0.5)
        failure = query.exception()
        query.stop()
        if failure is not None:
            raise RuntimeError(f"the training query failed: {failure}")
        spark.read.format("delta").load(str(work / "sent")).count()
        proc = SparkContext._gateway.proc
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    proc.stdin.close()      # the gateway JVM exits on end of input, and writes the archive
    proc.wait(timeout=300)


def _training_source(spark):
    """The job's own parse and wheel are fed by a rate source instead of the intake:
    level-1 messages, level-2 ones (5 s), which wait in the state for their timers, and
    some bad ones, so every path of a batch runs."""
    from pyspark.sql import functions as F

    def header(k, v):
        return F.struct(F.lit(k).alias("key"), F.lit(v).cast("binary").alias("value"))
    value = F.col("value")
    return (spark.readStream.format("rate").option("rowsPerSecond", 500).load()
            .select(F.lit(None).cast("binary").alias("key"),
                    value.cast("string").cast("binary").alias("value"),
                    (value % 2).cast("int").alias("ipart"), value.alias("ioff"),
                    F.unix_millis("timestamp").alias("append_ms"),
                    F.when(value % 50 == 0, F.array(header("DELAY", "-1")))
                     .when(value % 3 == 0, F.array(header("REAL_TOPIC", "cds-training"),
                                                   header("DELAY", "2")))
                     .otherwise(F.array(header("REAL_TOPIC", "cds-training"),
                                        header("DELAY", "1"))).alias("headers")))


def build(settings: Settings) -> Path | None:
    """Build the archive in a child process unless it exists; returns its path (None when
    this machine has no Java to build it for)."""
    archive = archive_path(settings)
    if archive is None or archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "streaming.tools.cds_train", "--train", str(partial)],
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError("the training JVM did not write a class data archive")
    partial.rename(archive)   # complete: the JVM wrote it and exited
    remove_stale(archive)
    return archive


def remove_stale(archive: Path) -> None:
    """Delete the archives beside `archive` (made for other jars or another Java; about
    190 MB each, and no JVM of these settings maps them again)."""
    for other in archive.parent.glob("spark-*.jsa"):
        if other != archive:
            other.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    from conf import load_settings

    argv = sys.argv[1:] if argv is None else argv
    settings = load_settings()
    if argv[:1] == ["--train"]:
        _train(settings, Path(argv[1]))
        return 0
    archive = build(settings)
    print(f"class data archive: {archive or 'none (no java found)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
