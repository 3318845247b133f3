"""The delivery ledger and its lookup: delivered, pending and dead-lettered messages."""
from __future__ import annotations

import os
import time
import subprocess
import sys

from kafka import KafkaProducer

from streaming import lookup
from streaming.producer import DelayProducer
from tests.conftest import PROJECT
from tests.support import assert_eventually, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_lookup_finds_delivered_pending_and_dead(job_settings, start_job, new_topic,
                                                 kafka_bootstrap, spark):
    settings = job_settings(delay_levels="1s 2s 60s")
    real = new_topic(**LOG_APPEND)
    job = start_job(settings)
    with DelayProducer(settings) as producer:
        delivered = producer.send(real, b"soon", level=1)
        pending = producer.send(real, b"later", level=3)
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    raw.send(settings.intake_topic, b"bad", headers=[("DELAY", b"1"), ("UNIQ_KEY", b"bad-1")],
             partition=0).get(timeout=30)
    raw.close()
    [record] = consume_all(kafka_bootstrap, real, expected=1, timeout_s=60)
    assert header_map(record)["UNIQ_KEY"].decode() == delivered.uniq_key
    consume_all(kafka_bootstrap, settings.dlq_topic, expected=1, timeout_s=30)

    checkpoint = __import__("pathlib").Path(job.checkpoint)

    def found(uniq):
        where = lookup.find(spark, uniq, settings.ledger_path, settings.dead_letter_path,
                            checkpoint)
        return where if where.status != "unknown" else None

    done = assert_eventually(lambda: found(delivered.uniq_key), timeout_s=30,
                             message="ledger row of the delivered message")
    assert done.status == "delivered"
    assert done.detail["topic"] == real and done.detail["lateness_ms"] >= 0
    dead = assert_eventually(lambda: found("bad-1"), timeout_s=30, message="dead-letter row")
    assert (dead.status, dead.detail["reason"]) == ("dead", "header REAL_TOPIC is missing")
    waiting = found(pending.uniq_key)
    assert waiting is not None and waiting.status == "pending"
    assert waiting.detail["level"] == 3 and waiting.detail["topic"] == real
    assert found("never-sent") is None

    # A fresh Spark session in another process, which wrote nothing, reads the same ledger.
    env = {**os.environ, "DELAYQ_DATA_DIR": str(settings.data_dir),
           "DELAYQ_BOOTSTRAP_SERVERS": kafka_bootstrap, "DELAYQ_DELAY_LEVELS": "1s 2s 60s"}
    out = subprocess.run([sys.executable, "-m", "streaming.cli", "ledger", delivered.uniq_key,
                          "--checkpoint", str(checkpoint)],
                         capture_output=True, text=True, timeout=300, cwd=PROJECT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{delivered.uniq_key}: delivered" in out.stdout
    assert real in out.stdout


def test_ledger_summary_per_level(job_settings, start_job, new_topic, kafka_bootstrap, spark):
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    with DelayProducer(settings) as producer:
        for level in (1, 1, 2):
            producer.send(real, b"x", level=level)
    consume_all(kafka_bootstrap, real, expected=3, timeout_s=60)

    def rows():
        got = {r["level"]: r for r in lookup.summary(spark, settings.ledger_path, None, None)}
        return got if sum(r["delivered"] for r in got.values()) == 3 else None
    got = assert_eventually(rows, timeout_s=30, message="ledger summary of 3 deliveries")
    assert (got[1]["delivered"], got[2]["delivered"]) == (2, 1)
    assert all(r["early"] == 0 and r["p50_ms"] >= 0 for r in got.values())

    # Maintenance (retention, OPTIMIZE, VACUUM) keeps today's rows and the table readable.
    from streaming.maintenance import maintain

    result = maintain(spark, settings.ledger_path, "sent_date", retain_days=30, vacuum_hours=168)
    assert result["deleted_before"] < time.strftime("%Y-%m-%d")
    assert spark.read.format("delta").load(str(settings.ledger_path)).count() == 3
    assert maintain(spark, settings.data_path / "tables" / "none", "d", None, 168)["skipped"]


def test_ledger_rows_still_spooled_at_a_stop_are_appended_once_at_the_next_start(
        job_settings, start_job, new_topic, kafka_bootstrap, spark, work_dir):
    """The ledger is written off the delivery path (sinks/ledger.py): a batch's rows are
    spooled beside the checkpoint before it commits. With the Delta append failing, the
    messages are still delivered, their rows stay spooled through the stop, `delayq ledger`
    finds them there, and the next start appends each exactly once."""
    from pathlib import Path
    from pyspark.sql import functions as F

    settings = job_settings(delay_levels="1s 2s 60s")
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-spool-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)

    def unavailable(*args, **kwargs):
        raise RuntimeError("Delta unavailable (test)")
    job._spool.ledger.append = unavailable
    with DelayProducer(settings) as producer:
        sent = {producer.send(real, f"m{i}".encode(), level=1 + i % 2).uniq_key for i in range(6)}
    consume_all(kafka_bootstrap, real, expected=6, timeout_s=60)
    spool = Path(checkpoint) / "ledger-spool"
    assert_eventually(lambda: job._spool.last_error and job._spool.behind(), timeout_s=30,
                      message="a failed append with rows spooled")
    job.stop()
    assert list(spool.glob("*.parquet")), "rows kept through the stop"
    in_table = (spark.read.format("delta").load(str(settings.ledger_path))
                .filter(F.col("uniq_key").isin(list(sent))).count())
    spooled_keys = {k for k in sent if lookup.find(spark, k, settings.ledger_path,
                                                    settings.dead_letter_path,
                                                    Path(checkpoint)).status == "delivered"}
    assert spooled_keys == sent, "delayq ledger finds every delivered message"

    start_job(settings, checkpoint=checkpoint)

    def per_key():
        got = {r["uniq_key"]: r["n"] for r in spark.read.format("delta")
               .load(str(settings.ledger_path)).groupBy("uniq_key")
               .agg(F.count("*").alias("n")).collect()}
        return got if set(got) >= sent else None
    got = assert_eventually(per_key, timeout_s=60, message="ledger rows after the restart")
    assert set(got) == sent and all(n == 1 for n in got.values()), got
    assert_eventually(lambda: not list(spool.glob("*.parquet")), timeout_s=30,
                      message="the spool emptied")
    assert in_table == 0, "no append got through while Delta was down"


def test_spark_and_delta_rs_appends_share_one_table_and_one_txn_rule(spark, tmp_path):
    """The ledger spool appends with delta-rs; Spark reads the table (past a checkpoint that
    delta-rs wrote), compacts it and may append to it with txnAppId/txnVersion. Each writer
    skips a version the other recorded."""
    import pyarrow as pa

    from sinks.delta import append_arrow_once, append_once

    path = str(tmp_path / "ledger")
    schema = "uniq_key string, sent_ms long, sent_date string"
    spark.createDataFrame([], schema).write.format("delta").partitionBy("sent_date").save(path)

    def rs(key, version):
        return append_arrow_once(pa.table({"uniq_key": [key], "sent_ms": [1],
                                           "sent_date": ["2026-11-23"]}),
                                 path, "query", version, ("sent_date",))

    def spark_append(key, version):
        append_once(spark.createDataFrame([(key, 1, "2026-11-23")], schema), path, "query",
                    version, ("sent_date",))

    def keys():
        return sorted(r[0] for r in spark.read.format("delta").load(path).select("uniq_key").collect())

    assert all(rs(f"k{v:03d}", v) for v in range(1, 106))
    assert any(p.name.endswith(".checkpoint.parquet") for p in (tmp_path / "ledger" / "_delta_log").iterdir())
    assert keys() == [f"k{v:03d}" for v in range(1, 106)]
    spark_append("skipped", 105)        # delta-rs recorded 105: Spark skips it
    spark_append("spark", 106)
    spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    assert not rs("skipped-too", 106)   # Spark recorded 106: delta-rs skips it
    assert rs("after-optimize", 107)
    assert keys() == sorted([f"k{v:03d}" for v in range(1, 106)] + ["spark", "after-optimize"])


def test_a_ledger_without_a_spool_appends_the_reported_rows_in_its_batch_once(spark, tmp_path):
    """A checkpoint on a store has no spool: each batch appends the rows the hold tasks
    reported through Spark itself, with the batch's txn version, so a replayed batch adds
    nothing; the sent frame is never built for it."""
    import json

    import pyarrow as pa
    import pytest

    from sinks.base import BatchSummary, Sent
    from sinks.kafka import KafkaSink
    from sinks.ledger import DeliveryLedger, delivered_rows
    from streaming.schema import OUTPUT_SPARK

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-on-a-store"}))
    ledger = DeliveryLedger(tmp_path / "ledger", checkpoint)
    ledger.ensure_table(spark, KafkaSink.sent_schema(OUTPUT_SPARK))
    assert ledger.spool is None

    def batch(batch_id, keys):
        summary = BatchSummary(batch_id, 1_795_446_000_000 + batch_id)
        summary.add("deliver", 1, None, len(keys))
        n = len(keys)
        released = pa.table({
            "uniq_key": keys, "topic": ["real"] * n, "partition": pa.array([None] * n, pa.int32()),
            "level": pa.array([1] * n, pa.int32()), "ipart": pa.array([0] * n, pa.int32()),
            "ioff": pa.array(range(n), pa.int64()), "append_ms": pa.array([1_000] * n, pa.int64()),
            "due_ms": pa.array([86_399_000] * n, pa.int64()),
            "sent_ms": pa.array([86_399_500 + i * 400 for i in range(n)], pa.int64())})
        summary.delivered = delivered_rows(released, summary)
        return summary

    never = Sent(lambda: pytest.fail("the sent frame was built"), spark)
    first = batch(0, ["a", "b", "c"])
    ledger.write_batch(never, first)
    ledger.write_batch(never, first)                 # the batch replayed after a crash
    ledger.write_batch(never, batch(1, ["d"]))
    table = spark.read.format("delta").load(str(tmp_path / "ledger"))
    collected = table.collect()
    assert sorted(r["uniq_key"] for r in collected) == ["a", "b", "c", "d"], "each row once"
    rows = {r["uniq_key"]: r.asDict() for r in collected}
    assert rows["a"] == {**first.delivered.to_pylist()[0]}
    assert (rows["b"]["sent_date"], rows["b"]["lateness_ms"]) == ("1970-01-01", 900)
    assert (rows["c"]["sent_date"], rows["c"]["lateness_ms"]) == ("1970-01-02", 1_300)
