"""The delivery ledger and its lookup: delivered, pending and dead-lettered messages."""
from __future__ import annotations

import os
import time
import subprocess
import sys

import pytest
from kafka import KafkaProducer

from streaming.ledger import lookup
from streaming.ledger.tables import Tables
from streaming.producer import DelayProducer
from tests.conftest import PROJECT
from tests.support import assert_eventually, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_lookup_and_summary_find_delivered_pending_and_dead(job_settings, start_job, new_topic,
                                                            kafka_bootstrap, spark):
    settings = job_settings(delay_levels="1s 2s 5m")
    real = new_topic(**LOG_APPEND)
    job = start_job(settings)
    with DelayProducer(settings) as producer:
        delivered = producer.send(real, b"soon", level=1)
        others = [producer.send(real, b"x", level=level) for level in (1, 2)]
        pending = producer.send(real, b"later", level=3)
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    raw.send(settings.intake_topic, b"bad", headers=[("DELAY", b"1"), ("UNIQ_KEY", b"bad-1")],
             partition=0).get(timeout=30)
    raw.close()
    records = consume_all(kafka_bootstrap, real, expected=3, timeout_s=60, idle_s=2)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in records) == sorted(
        [delivered.uniq_key] + [o.uniq_key for o in others])
    consume_all(kafka_bootstrap, settings.dlq_topic, expected=1, timeout_s=30)

    checkpoint = __import__("pathlib").Path(job.checkpoint)

    def found(uniq):
        where = lookup.find(Tables(lambda: spark), settings, uniq, checkpoint)
        return where if where.status != "unknown" else None

    # Sent, its ledger row is in the ledger topic before the ledger query appends it to Delta.
    recent = assert_eventually(lambda: lookup.in_topics(settings, delivered.uniq_key),
                               timeout_s=30, message="the ledger topic's row")
    assert recent.status == "delivered" and recent.detail["topic"] == real
    done = assert_eventually(lambda: found(delivered.uniq_key), timeout_s=30,
                             message="ledger row of the delivered message")
    assert done.status == "delivered"
    assert done.detail["topic"] == real and done.detail["lateness_ms"] >= 0
    # Where it landed, as its record on the real topic says (the partitioner chose it).
    landed = next(r for r in records if header_map(r)["UNIQ_KEY"] == delivered.uniq_key.encode())
    assert (done.detail["partition"], done.detail["offset"]) == (landed.partition, landed.offset)
    dead = assert_eventually(lambda: found("bad-1"), timeout_s=30, message="dead-letter row")
    assert (dead.status, dead.detail["reason"]) == ("dead", "missing_real_topic: header REAL_TOPIC is missing")
    waiting = found(pending.uniq_key)
    assert waiting is not None and waiting.status == "pending"
    assert waiting.detail["level"] == 3 and waiting.detail["topic"] == real
    assert found("never-sent") is None

    # `delayq ledger` in another process reads the same local ledger without Spark: with no
    # jars to start it from, it still answers.
    env = {**os.environ, "DELAYQ_DATA_DIR": str(settings.data_dir),
           "DELAYQ_BOOTSTRAP_SERVERS": kafka_bootstrap, "DELAYQ_DELAY_LEVELS": "1s 2s 5m",
           "DELAYQ_JARS_DIR": str(settings.data_dir / "no-jars")}
    out = subprocess.run([sys.executable, "-m", "streaming.cli.main", "ledger", delivered.uniq_key,
                          "--checkpoint", str(checkpoint)],
                         capture_output=True, text=True, timeout=300, cwd=PROJECT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{delivered.uniq_key}: delivered" in out.stdout
    assert real in out.stdout and f"offset       {landed.offset}" in out.stdout

    # The summary per level: the three deliveries (not the dead letter, nor the message due in 5 min).
    def rows():
        got = {r["level"]: r for r in Tables(lambda: spark).summary(settings.ledger_path, None,
                                                                      None)}
        assert sum(r["delivered"] for r in got.values()) == 3, got
        return got
    got = assert_eventually(rows, timeout_s=30, message="ledger summary of 3 deliveries")
    assert (got[1]["delivered"], got[2]["delivered"]) == (2, 1)
    assert all(r["early"] == 0 and r["p50_ms"] >= 0 for r in got.values())

    # Maintenance (retention, OPTIMIZE, VACUUM) keeps today's rows and the table readable.
    from streaming.ledger.maintenance import maintain

    result = maintain(spark, settings.ledger_path, "sent_date", retain_days=30, vacuum_hours=168)
    assert result["deleted_before"] < time.strftime("%Y-%m-%d")
    assert spark.read.format("delta").load(str(settings.ledger_path)).count() == 3
    assert maintain(spark, settings.data_path / "tables" / "none", "d", None, 168)["skipped"]


def test_lookup_finds_a_message_its_dispatch_task_read_from_the_intake(
        job_settings, start_job, new_topic, kafka_bootstrap):
    """A level the dispatch tasks read from the intake themselves (streaming/dispatch/direct.py): held by its
    task, the message is pending, above the task's commit on the intake."""
    settings = job_settings(delay_levels="1s 2s 60s", dispatch_direct_max_delay_ms=60_000)
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    with DelayProducer(settings) as producer:
        held = producer.send(real, b"later", level=3)
    where = assert_eventually(lambda: lookup.in_topics(settings, held.uniq_key), timeout_s=30,
                              message="the held message in the intake")
    assert where.status == "pending" and where.detail["level"] == 3
    assert where.detail["topic"] == real and "dispatch task" in where.detail["where"]
    assert lookup.in_topics(settings, "never-sent") is None


def test_lookup_finds_a_reference_fired_into_the_ready_topic_and_names_its_topic(
        job_settings, new_topic, kafka_bootstrap):
    """A message fired and not yet sent is a reference on the ready topic (its value as
    sinks/ready.py reference_value writes it, no body): `delayq ledger` finds it there by its
    UNIQ_KEY, past the run's stop record, and reads its REAL_TOPIC from its intake record."""
    from confluent_kafka import Producer

    from streaming.dispatch.rules import READY_STOP

    settings = job_settings(dispatch_direct_max_delay_ms=-1)
    real = new_topic(**LOG_APPEND)
    intake = new_topic(name=settings.intake_topic, **LOG_APPEND)
    new_topic(name=settings.ready_topic)
    new_topic(name=settings.ledger_topic, **LOG_APPEND)
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    meta = raw.send(intake, b"body", headers=[("REAL_TOPIC", real.encode()), ("DELAY", b"3"),
                                              ("UNIQ_KEY", b"order,7")], partition=0).get(30)
    raw.close()
    ready = Producer({"bootstrap.servers": kafka_bootstrap})
    ready.produce(settings.ready_topic, value=b"run-1", partition=0,
                  headers=[(READY_STOP, b"1")])
    due = meta.timestamp + 3000
    ready.produce(settings.ready_topic, partition=0,
                  value=f"{due},3,0,{meta.offset},{meta.timestamp},order,7".encode())
    ready.flush(30)

    where = lookup.in_topics(settings, "order,7")
    assert where is not None and where.status == "pending"
    assert where.detail["level"] == 3 and where.detail["topic"] == real
    assert where.detail["intake"] == f"0-{meta.offset}"
    assert "the ready topic, partition 0" in where.detail["where"]
    assert lookup.in_topics(settings, "order,8") is None


def test_the_ledger_query_reads_only_what_committed_transactions_sent(
        job_settings, new_topic, kafka_bootstrap, spark, work_dir):
    """A dispatch task's transaction that aborted (its task killed, fenced by the next) left its
    ledger rows in the ledger topic: the ledger query reads past them, as a read_committed
    consumer of the real topics never saw their messages."""
    from confluent_kafka import Producer

    from streaming.ledger.query import ledger_stream
    from streaming.stages import ledger_config_of

    settings = job_settings()
    new_topic(name=settings.ledger_topic, **LOG_APPEND)
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"t-{settings.ledger_topic}"})
    producer.init_transactions(30)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        producer.begin_transaction()
        producer.produce(settings.ledger_topic, value=value, partition=0)
        producer.flush(30)   # in the log before the abort, as a killed task's records are
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    table = f"ledger_{settings.ledger_topic}".replace("-", "_").replace(".", "_")
    query = (ledger_stream(spark, ledger_config_of(settings)).writeStream.format("memory")
             .queryName(table)
             .option("checkpointLocation", str(work_dir / "ledger-read"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    got = [bytes(r.value) for r in spark.table(table).collect()]
    assert got == [b"committed"]


def _ledger_batch(acked):
    """The ledger records of `acked` rows as the ledger query's task receives them."""
    import pyarrow as pa

    from streaming.ledger.records import ledger_chunks

    [(_, record)] = ledger_chunks(acked, 100, 1_000_000)
    return pa.RecordBatch.from_pydict({"value": [record]})


def _acked(keys, landed):
    from streaming.dispatch.rules import Row

    return [(Row(1_000, 0, i, i, "orders", None, None, b"v", [], 1, 900, key), 1_005, None,
             landed) for i, key in enumerate(keys)]


def test_a_ledger_table_from_before_the_offset_column_gains_it_at_the_next_append(
        job_settings, spark):
    """An upgrade: the ledger query's first append adds `offset` to a table the version before
    wrote (by Spark) without it; the older rows read it as null, the new ones have it."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from streaming.ledger.append import LedgerAppend, ledger_task
    from streaming.ledger.records import ledger_rows, ledger_schema

    settings = job_settings()
    old = spark.createDataFrame(
        ledger_rows(_ledger_batch(_acked(["old-1", "old-2"], None))["value"][0].as_py())
        .to_pandas(), from_arrow_schema(ledger_schema()))
    # The table as the version before wrote it: the same columns but `offset`.
    (old.select(
        "uniq_key", "topic", "partition", "level", F.col("ipart").alias("intake_partition"),
        F.col("ioff").alias("intake_offset"), "append_ms", "due_ms", "sent_ms",
        (F.col("sent_ms") - F.col("due_ms")).alias("lateness_ms"),
        F.lit(0).cast("long").alias("batch_id"), F.lit(0).cast("long").alias("batch_time"),
        F.lit("1970-01-01").alias("sent_date"))
     .write.format("delta").partitionBy("sent_date").save(str(settings.ledger_path)))
    target = LedgerAppend(str(settings.ledger_path), {}, "upgrade-test", 1, 2_000)
    list(ledger_task(target, [_ledger_batch(_acked(["new-1"], (3, 77)))]))
    got = {r["uniq_key"]: (r["partition"], r["offset"], r["status"]) for r in
           spark.read.format("delta").load(str(settings.ledger_path)).collect()}
    assert got == {"old-1": (None, None, None), "old-2": (None, None, None),
                   "new-1": (3, 77, "delivered")}


def test_a_ledger_batch_run_again_is_counted_again_and_appended_once(tmp_path):
    """A batch's task run again (a restart replays the batch the query had not committed, or
    Spark retries its task): its counts come again, for the one result the driver reads, and
    the table holds its rows once, whatever ran before; the next batch is appended."""
    from deltalake import DeltaTable

    from streaming.ledger.append import LedgerAppend, ledger_task

    path = str(tmp_path / "ledger")
    for batch_id, keys in ((0, ["a", "b"]), (0, ["a", "b"]), (1, ["c"]), (0, ["a", "b"])):
        [counts] = list(ledger_task(LedgerAppend(path, {}, "replay-test", batch_id, 7),
                                    [_ledger_batch(_acked(keys, (0, 1)))]))
        assert counts.to_pylist()[0]["count_all"] == len(keys)
    table = DeltaTable(path)
    keys = sorted(table.to_pyarrow_table(columns=["uniq_key"])["uniq_key"].to_pylist())
    assert keys == ["a", "b", "c"] and table.transaction_version("replay-test") == 1


def test_the_delivery_counts_are_an_aggregation_of_the_batch_s_ledger_rows():
    """The counts behind the delivery metrics come from the batch's rows, the result of its one
    task (not an accumulator a retried task adds to twice): deliveries by level, dead letters by
    reason, the direct rows as received, and the lateness histogram."""
    from sinks.metrics import LATENESS_BUCKETS
    from streaming.dispatch.rules import Row
    from streaming.ledger.append import LedgerAppend, ledger_task
    from streaming.ledger.query import LedgerWriter

    def row(key, level, due, direct=True):
        return Row(due, 0, 1, 7, "orders", None, None, b"v", [], level, due - 100, key,
                   source=("intake", 0) if direct else None)

    acked = [(row("a", 1, 1_000), 1_005, None, (0, 1)),            # direct, 5 ms late
             (row("b", 1, 1_000), 3_000, None, (0, 2)),            # direct, 2 s late
             (row("c", 2, 1_000, direct=False), 1_040, None, (0, 3)),   # fired, 40 ms late
             (row("d", 1, 1_000), 1_000, "unknown_topic: gone", None)]  # direct, dead
    # Split in two input batches, whose counts add up.
    [counts] = list(ledger_task(LedgerAppend(None, {}, "", 9, 0),
                                [_ledger_batch(acked[:2]), _ledger_batch(acked[2:])]))
    summary = LedgerWriter._summary(9, counts.to_pylist())
    assert summary.count("deliver") == 3 and summary.count("dead") == 1
    assert summary.delivered_by_level == {1: 2, 2: 1}
    assert summary.received_by_level == {1: 3}, "the direct rows, dead ones too"
    assert summary.dead_by_reason == {"unknown_topic": 1}
    buckets, total, seconds = summary.lateness
    assert total == 3 and seconds == pytest.approx(2.045)
    assert [n for bound, n in zip(LATENESS_BUCKETS, buckets) if bound in (0.01, 0.05, 2.0)] \
        == [1, 2, 3]
