"""The hold's rows leave the Python worker when released, not when its task ends.

PySpark buffers a worker's Arrow output (64 KiB) and flushes it when full or at the end of
the task; `sinks.kafka.worker_output_flush` finds that stream so the hold can flush it before
each wait. Run in real Spark workers, writing to the real broker."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient
from pyspark.sql import functions as F

from sinks.base import BatchSummary
from sinks.kafka import (PRODUCER_OPTIONS, KafkaSink, _no_flush, hold_and_stamp,
                         worker_output_flush)
from sinks.ledger import collected_rows, delivered_rows
from streaming.admin import TopicCatalog
from tests.support import consume_all

LATER_S = 6


def test_the_hold_finds_the_workers_output_stream(spark):
    def probe(batches):
        flush = worker_output_flush()
        for _ in batches:
            pass
        yield pa.record_batch({"found": pa.array([flush is not _no_flush])})

    found = spark.range(1).repartition(1).mapInArrow(probe, "found boolean").collect()
    assert [r["found"] for r in found] == [True]


def test_a_released_row_reaches_the_broker_before_the_next_one_is_due(spark, new_topic,
                                                                      kafka_bootstrap):
    topic = new_topic(message_timestamp_type="LogAppendTime")
    now_ms = int(time.time() * 1000)
    rows = spark.createDataFrame(
        [(topic, b"now", now_ms), (topic, b"later", now_ms + LATER_S * 1000)],
        "topic string, value binary, due_ms long").repartition(1)
    schema = KafkaSink.sent_schema(rows.schema)
    (rows.mapInArrow(hold_and_stamp, schema).select("topic", "value")
     .write.mode("append").format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
     .options(**PRODUCER_OPTIONS).save())
    records = {r.value: r.timestamp for r in consume_all(kafka_bootstrap, topic, expected=2)}
    later_due = now_ms + LATER_S * 1000
    assert records[b"later"] >= later_due, "never early"
    # Unflushed, "now" waited in the worker's buffer until the task ended, after "later".
    assert records[b"now"] < later_due, (
        f"the first row reached the broker {records[b'now'] - now_ms} ms after its release, "
        f"with the second ({LATER_S} s later)")


@pytest.mark.parametrize("catalog_knows", ["topic", "another", "nothing"])
def test_the_kafka_sink_sends_each_row_as_released_and_knows_when(spark, new_topic,
                                                                  kafka_bootstrap, catalog_knows):
    """KafkaSink.write_batch: no cache between the hold and the writer (a row leaves when
    released, not with the last row of its task), and `sent_ms` for every row from the hold
    tasks' reports: never before due, never after the broker had the record. The same when
    the sink knows other topics but not this one (its deliveries wait for the driver's look-up
    and go in a second write), and when it knows none yet (an aggregate job looks the batch's
    topics up first, and one write sends them all)."""
    topic = new_topic(message_timestamp_type="LogAppendTime")
    now_ms = int(time.time() * 1000)
    later_due = now_ms + LATER_S * 1000
    rows = spark.createDataFrame(
        [("deliver", topic, b"overdue", 1, now_ms - 2_000, "k-overdue"),
         ("deliver", topic, b"later", 1, later_due, "k-later"),
         ("deliver", topic, b"soon", 2, now_ms + 1_000, "k-soon"),
         ("dead", topic, b"dead", None, 0, None)],
        "kind string, topic string, value binary, level int, due_ms long, uniq_key string"
    ).select("kind", "topic", F.lit(None).cast("int").alias("partition"),
             F.lit(None).cast("binary").alias("key"), "value",
             F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
             "uniq_key", "level", "due_ms", F.lit(now_ms - 3_000).alias("append_ms"),
             F.lit(0).alias("ipart"), F.lit(1).cast("long").alias("ioff"),
             F.when(F.col("kind") == "dead", F.lit("bad")).alias("reason"),
             F.lit(None).cast("int").alias("received"),
             F.lit(None).cast("int").alias("pending_delta"))
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    catalog = TopicCatalog(admin)
    if catalog_knows == "topic":
        assert catalog.partitions([topic]) == {topic: 1}
    elif catalog_knows == "another":
        other = new_topic()
        assert catalog.partitions([other]) == {other: 1}
    sink = KafkaSink({"kafka.bootstrap.servers": kafka_bootstrap}, "unused-dlq", catalog, 2)
    summary = BatchSummary(0)
    try:
        written = sink.write_batch(rows, summary)
    finally:
        admin.close()
    assert (summary.by_kind, summary.topics) == ({"deliver": 3, "dead": 1}, {topic})
    assert ("kafka_withheld" in summary.timings) is (catalog_knows == "another")
    sent = {r["value"]: r for r in written.frame().collect()}
    broker = {r.value: r.timestamp for r in consume_all(kafka_bootstrap, topic, expected=4)}
    for value in (b"overdue", b"later", b"soon"):
        assert sent[value]["due_ms"] <= sent[value]["sent_ms"] <= broker[value], value
        assert broker[value] >= sent[value]["due_ms"], f"{value} early"
    assert sent[b"later"]["sent_ms"] == later_due
    assert sent[b"dead"]["sent_ms"] is not None
    assert broker[b"overdue"] < later_due, "the overdue row waited for the later one's release"
    # The hold tasks' reports (the ledger's rows): each delivery once, released between its
    # due time and the broker's timestamp of it.
    released = {r["uniq_key"]: r for r in summary.released.to_pylist()}
    assert sorted(released) == ["k-later", "k-overdue", "k-soon"]
    for value in (b"overdue", b"later", b"soon"):
        row = released["k-" + value.decode()]
        assert row["due_ms"] <= row["sent_ms"] <= broker[value], value
    # The fallback for a batch whose reports miss a delivery: the same ledger rows by a Spark
    # job over the sent frame, in the same layout as those built from the reports.
    fallback = collected_rows(written.frame(), summary)
    assert fallback.schema == delivered_rows(summary.released, summary).schema
    by_key = {r["uniq_key"]: r for r in fallback.to_pylist()}
    assert sorted(by_key) == ["k-later", "k-overdue", "k-soon"]
    for value in (b"overdue", b"later", b"soon"):
        row = by_key["k-" + value.decode()]
        assert row["due_ms"] <= row["sent_ms"] <= broker[value], value
        assert row["lateness_ms"] == row["sent_ms"] - row["due_ms"]


@pytest.mark.parametrize("catalog_knows", ["nothing", "another"])
def test_a_delivery_the_cluster_refuses_is_a_dead_letter_with_its_reason(spark, new_topic,
                                                                         kafka_bootstrap,
                                                                         catalog_knows):
    """Both ways a refusal is decided: on a sink's first batch (aggregate, plan and refuse
    before the one write) and once it knows topics (held back by the clearance, refused and
    sent by the second write). The good delivery beside it leaves in either case."""
    topic, dlq = new_topic(), new_topic()
    missing = f"no-such-topic-{time.time_ns()}"
    now_ms = int(time.time() * 1000)
    rows = spark.createDataFrame(
        [("deliver", topic, b"good", "k-good"), ("deliver", missing, b"refused", "k-refused")],
        "kind string, topic string, value binary, uniq_key string"
    ).select("kind", "topic", F.lit(None).cast("int").alias("partition"),
             F.lit(None).cast("binary").alias("key"), "value",
             F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
             "uniq_key", F.lit(1).alias("level"), F.lit(now_ms - 1_000).alias("due_ms"),
             F.lit(now_ms - 2_000).alias("append_ms"), F.lit(0).alias("ipart"),
             F.lit(1).cast("long").alias("ioff"), F.lit(None).cast("string").alias("reason"),
             F.lit(None).cast("int").alias("received"),
             F.lit(None).cast("int").alias("pending_delta"))
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    catalog = TopicCatalog(admin)
    if catalog_knows == "another":
        other = new_topic()
        assert catalog.partitions([other]) == {other: 1}
    sink = KafkaSink({"kafka.bootstrap.servers": kafka_bootstrap}, dlq, catalog, 2)
    summary = BatchSummary(0)
    try:
        written = sink.write_batch(rows, summary)
    finally:
        admin.close()
    assert summary.by_kind == {"deliver": 1, "dead": 1}
    assert summary.dead_by_reason == {"unknown_topic": 1}
    assert ("kafka_withheld" in summary.timings) is (catalog_knows == "another")
    assert [r.value for r in consume_all(kafka_bootstrap, topic, expected=1, idle_s=1)] == [b"good"]
    [dead] = consume_all(kafka_bootstrap, dlq, expected=1, idle_s=1)
    assert dead.value == b"refused"
    assert missing in dict(dead.headers)["DLQ_REASON"].decode()
    sent = {r["value"]: r["kind"] for r in written.frame().collect()}
    assert sent == {b"good": "deliver", b"refused": "dead"}
    assert [r["uniq_key"] for r in summary.released.to_pylist()] == ["k-good"]
