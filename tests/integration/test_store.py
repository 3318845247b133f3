"""The store on a real HDFS (NameNode and DataNode from .lib/hdfs): delayq's own files beside
Spark's, and the checkpoint's guards, read and written through Spark's Hadoop client; the ledger
on a real S3 server (s3proxy) read by delta-rs. The whole job on HDFS and on S3, killed under
load: tests/faults/test_kill.py[hdfs-at_least_once] and [s3]."""
from __future__ import annotations

import json
import uuid

import pytest

from conf import load_settings
from sinks import store
from sinks.cold import ColdTier
from streaming.wheel import checkpoint as ckpt
from streaming.wheel.offsets import delay_offset_table


@pytest.fixture
def location(hdfs_uri, spark):
    return f"{hdfs_uri}/store-{uuid.uuid4().hex[:8]}"


def test_a_file_on_hdfs_is_replaced_whole_and_listed(location):
    folder = store.path(location)
    target = folder / "cold" / "loaded_until"
    assert not target.exists() and not folder.is_dir()
    with pytest.raises(FileNotFoundError):
        target.read_text()
    store.write_atomic(target, '{"loaded_until": 1}')
    store.write_atomic(target, '{"loaded_until": 2}')
    assert target.read_text() == '{"loaded_until": 2}'
    assert [p.name for p in target.parent.iterdir()] == ["loaded_until"], "no temporary left"
    assert folder.is_dir() and not target.is_dir()


def test_the_cold_tier_keeps_its_marker_on_hdfs(location, spark, test_settings):
    now = [7_200.0]
    cold = ColdTier(spark, f"{location}/tables/cold", f"{location}/ckpt", "intake", {},
                    bucket_ms=3_600_000, horizon_ms=600_000, seal_key="", intake_ends=dict,
                    clock=lambda: now[0])
    first = cold.loaded_until()
    assert first == 7_200_000, "the bucket holding the horizon's edge"
    cold._set_loaded(first + 3_600_000)
    again = ColdTier(spark, f"{location}/tables/cold", f"{location}/ckpt", "intake", {},
                     bucket_ms=3_600_000, horizon_ms=600_000, seal_key="", intake_ends=dict,
                     clock=lambda: now[0])
    assert again.loaded_until() == 10_800_000, "a restart reads the marker back from HDFS"


def test_the_checkpoint_guards_work_on_hdfs(location, test_settings):
    settings = load_settings(**{**test_settings.model_dump(), "store": location})
    checkpoint = settings.checkpoint_path
    assert checkpoint.startswith("hdfs://")
    assert ckpt.check(settings, checkpoint, lambda: {}) == "fresh"
    with pytest.raises(ckpt.CheckpointError, match="missing or empty"):
        ckpt.check(settings, checkpoint, lambda: {0: 42})
    ckpt.write_stamp(settings, checkpoint, started_ms=1_000)
    # A checkpoint Spark has planned a batch into.
    root = store.path(checkpoint)
    store.write_atomic(root / "metadata", json.dumps({"id": "q"}) + "\n")
    store.write_atomic(root / "offsets" / "0", 'v1\n{"batchWatermarkMs":0}\n{"intake":{"0":1}}\n')
    assert ckpt.check(settings, checkpoint, lambda: {0: 1}) == "resume"
    # The delayOffset view (`delayq offsets`) reads Spark's logs there too.
    store.write_atomic(root / "commits" / "0", 'v1\n{"nextBatchWatermarkMs":0}\n')
    assert delay_offset_table(root, "intake") == {"offsetTable": {"1": 1}}
    assert ckpt.started_ms(checkpoint, "resume", now_ms=9_000) == 1_000
    moved = load_settings(**{**settings.model_dump(), "slot_ms": 500})
    with pytest.raises(ckpt.CheckpointError, match="slot_ms: 1000 in the checkpoint, 500 now"):
        ckpt.check(moved, checkpoint, lambda: {0: 1})
    store.write_atomic(root / "offsets" / "0", "torn")
    with pytest.raises(ckpt.CheckpointError, match="torn"):
        ckpt.check(settings, checkpoint, lambda: {0: 1})


@pytest.mark.parametrize("where", ["hdfs", "local"])
def test_the_ledger_and_dead_letter_tables_are_created_empty_as_spark_writes_them(
        where, request, spark, tmp_path):
    """Created before the first batch (delta-rs in a folder, Delta's builder on a store), with
    the schema and partitioning a Spark write of the same rows gives, and created once."""
    from sinks.kafka import sent_schema
    from sinks.dead_letters import DeadLetterTable, dead_letter_columns
    from streaming.wheel.schema import WITH_BODY_SPARK

    root = request.getfixturevalue("location") if where == "hdfs" else str(tmp_path)
    sent = sent_schema(WITH_BODY_SPARK)
    for kind, column in ((DeadLetterTable, "dead_date"),):
        table = kind(f"{root}/{column}", f"{root}/ckpt")
        table.ensure_table(spark, sent)
        table.ensure_table(spark, sent)   # already there: left as it is
        written = spark.createDataFrame([], sent).select(*dead_letter_columns(-1))
        written.write.format("delta").partitionBy(column).save(f"{root}/{column}-by-spark")
        created = spark.read.format("delta").load(table.path)
        by_spark = spark.read.format("delta").load(f"{root}/{column}-by-spark")
        assert created.schema == by_spark.schema
        assert created.count() == 0
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{table.path}`").first()
        assert detail["partitionColumns"] == [column] and detail["numFiles"] == 0
        assert spark.sql(f"DESCRIBE HISTORY delta.`{table.path}`").count() == 1, "created once"


def test_the_ledger_lookup_reads_a_table_on_hdfs_through_spark_as_delta_rs_reads_it_locally(
        location, spark, tmp_path):
    """`delayq ledger` on a store goes through Spark, on a local folder through delta-rs: the
    same rows give the same answer and the same summary either way."""
    from streaming.ledger.tables import Tables

    rows = [(f"k{i}", "orders", i % 2, 100 + i, 1 + i % 2, 1_000 + i, 1_000 + i + i * 7,
             i * 7, "2026-12-03") for i in range(40)]
    frame = spark.createDataFrame(rows, "uniq_key string, topic string, partition int, "
                                        "offset long, level int, due_ms long, sent_ms long, "
                                        "lateness_ms long, sent_date string")
    answers = []
    for where in (f"{location}/ledger", str(tmp_path / "ledger")):
        frame.write.format("delta").partitionBy("sent_date").save(where)
        tables = Tables(lambda: spark)
        found = tables.matching(where, "k7")
        answers.append(([(r["partition"], r["offset"], r["lateness_ms"]) for r in found],
                        [(r["level"], r["delivered"], r["max_ms"], r["early"])
                         for r in tables.summary(where, 1_010, None)],
                        tables.matching(where, "missing")))
    assert answers[0][0] == [(1, 107, 49)]
    # Sent from 1,010 ms on: rows 2-39, levels 1 (even rows) and 2 (odd rows), 19 each.
    assert answers[0][1] == [(1, 19, 266, 0), (2, 19, 273, 0)]
    assert answers[0] == answers[1]
    assert Tables(lambda: spark).matching(f"{location}/none", "k7") == []
    assert Tables(lambda: spark).summary(str(tmp_path / "none"), None, None) == []


def test_the_ledger_on_s3_is_read_by_delta_rs_as_a_local_one_and_its_summary_starts_no_spark(
        s3_store, test_settings, tmp_path):
    """`delayq ledger` on an S3 ledger (a real s3proxy): delta-rs in the command's own process,
    the same answers as on a local folder, and `--summary` with no Spark to start (SPARK_HOME
    points nowhere)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow as pa
    from deltalake import write_deltalake

    from streaming.ledger.tables import Tables

    n = 100_000
    rows = pa.table({"uniq_key": [f"k{i}" for i in range(n)], "topic": ["orders"] * n,
                     "partition": pa.array([i % 2 for i in range(n)], pa.int32()),
                     "offset": list(range(n)), "level": pa.array([1 + i % 2 for i in range(n)],
                                                                 pa.int32()),
                     "due_ms": [1_000 + i for i in range(n)],
                     "sent_ms": [1_000 + i + i % 97 for i in range(n)],
                     "lateness_ms": [i % 97 for i in range(n)],
                     "batch_id": [i // 5_000 for i in range(n)],
                     "intake_partition": pa.array([i % 3 for i in range(n)], pa.int32()),
                     "intake_offset": list(range(n)), "sent_date": ["2026-12-05"] * n})
    settings = load_settings(**{**test_settings.model_dump(), **s3_store,
                                "store": f"s3a://delayq/ledger-{uuid.uuid4().hex[:8]}"})
    options = store.object_store_options(settings)
    write_deltalake(settings.ledger_path, rows, partition_by=["sent_date"],
                    storage_options={**options, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    write_deltalake(str(tmp_path / "ledger"), rows, partition_by=["sent_date"])
    tables = Tables(lambda: pytest.fail("no Spark for a ledger on S3"), options)
    on_s3 = (tables.matching(settings.ledger_path, "k7"), tables.summary(settings.ledger_path,
                                                                         1_010, None))
    local = (tables.matching(str(tmp_path / "ledger"), "k7"),
             tables.summary(str(tmp_path / "ledger"), 1_010, None))
    assert on_s3 == local and on_s3[0][0]["lateness_ms"] == 7
    assert [(r["level"], r["delivered"], r["max_ms"], r["early"]) for r in on_s3[1]] == \
        [(1, 49_997, 96, 0), (2, 49_998, 96, 0)]   # sent from 1,010 ms: rows 5 on
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    env.update({f"DELAYQ_{k.upper()}": str(v) for k, v in settings.model_dump().items()
                if k in ("store", "data_dir") or k.startswith("s3_")},
               DELAYQ_S3_SECRET_KEY=settings.s3_secret_key.get_secret_value(),
               SPARK_HOME="/nonexistent")
    summary = subprocess.run([sys.executable, "-m", "streaming.cli.main", "ledger", "--summary"],
                             cwd=Path(__file__).parents[2], env=env, capture_output=True,
                             text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr[-2000:]
    assert [line.split()[:2] for line in summary.stdout.splitlines()[1:]] == \
        [["1", "50000"], ["2", "50000"]]
    found = subprocess.run([sys.executable, "-m", "streaming.cli.main", "ledger", "k7"],
                           cwd=Path(__file__).parents[2], env=env, capture_output=True,
                           text=True, timeout=120)
    assert found.returncode == 0 and found.stdout.startswith("k7: delivered"), \
        found.stdout + found.stderr[-2000:]


def test_a_write_of_the_cold_marker_killed_on_s3_leaves_the_marker_before_it(s3_store,
                                                                              test_settings):
    """The marker on a real S3 server: a process killed (SIGKILL, with its JVM) in the middle of
    writing it leaves the last whole one, never a part or nothing (one object, made visible at
    its close)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.support import store_text

    settings = load_settings(**{**test_settings.model_dump(), **s3_store,
                                "store": f"s3a://delayq/marker-{uuid.uuid4().hex[:8]}"})
    marker = f"{settings.checkpoint_path}/cold/loaded_until"
    code = f"""
import os, signal
from conf import load_settings
from sinks import store
from streaming.spark.session import build_session
build_session(load_settings(), {{"spark.master": "local[1]", "spark.ui.enabled": "false"}})
marker = store.path({marker!r})
store.write_atomic(marker, '{{"loaded_until": 1}}')
_, _, fs, path = marker._fs()   # write_atomic's own write, cut before its close
out = fs.create(path, True)
out.write(b'{{"loaded_until": 2')
out.flush()
os.killpg(0, signal.SIGKILL)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    env.update({f"DELAYQ_{k.upper()}": str(v) for k, v in settings.model_dump().items()
                if k in ("store", "data_dir", "spark_driver_memory") or k.startswith("s3_")},
               DELAYQ_S3_SECRET_KEY=settings.s3_secret_key.get_secret_value())
    killed = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], env=env,
                            capture_output=True, text=True, timeout=180, start_new_session=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert store_text(settings, marker) == '{"loaded_until": 1}'
