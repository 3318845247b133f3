"""The three real JVM components work, alone and together: Kafka broker, Spark with the
Kafka connector, Delta."""
from __future__ import annotations

from kafka import KafkaProducer

from tests.support import consume_all, free_ports


def test_broker_starts_stops_and_restarts_with_its_data(work_dir):
    from streaming.tools import broker
    from tests.conftest import PROJECT

    ports = free_ports(2)
    spec = broker.BrokerSpec(home=work_dir / "own-broker", jars=PROJECT / ".lib" / "kafka",
                             port=ports[0], controller_port=ports[1], heap="256m")
    pid = broker.start(spec)
    try:
        assert broker.start(spec) == pid, "a second start reuses the running broker"
        producer = KafkaProducer(bootstrap_servers=spec.bootstrap)
        from kafka.admin import KafkaAdminClient, NewTopic
        admin = KafkaAdminClient(bootstrap_servers=spec.bootstrap)
        admin.create_topics([NewTopic("kept", 1, 1)], wait_for_metadata=True)
        admin.close()
        producer.send("kept", b"survives a restart").get(timeout=30)
        producer.close()
        assert broker.stop(spec)
        assert broker.status(spec)["running"] is False
        assert broker.stop(spec) is False, "stopping a stopped broker is harmless"

        new_pid = broker.start(spec)
        assert new_pid != pid
        records = consume_all(spec.bootstrap, "kept", expected=1, timeout_s=60)
        assert [r.value for r in records] == [b"survives a restart"]
    finally:
        broker.stop(spec)


def test_an_observed_kafka_write_reports_only_through_the_v2_writer(spark, kafka_bootstrap,
                                                                   new_topic):
    """Why streaming/spark/session.py takes Kafka out of spark.sql.sources.useV1SourceList: an
    Observation on a write to Kafka through Spark's V1 writer never gets its metrics (Spark
    4.2.0; the wheel's write, sinks/ready.py, would wait for ever), through V2 it does. When the
    V1 side reports, the setting can go."""
    import threading

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    topic = new_topic()

    def observed_write() -> Observation:
        seen = Observation()
        (spark.range(3).select(F.col("id").cast("string").alias("value"))
         .observe(seen, F.count(F.lit(1)).alias("n")).write.mode("append").format("kafka")
         .option("kafka.bootstrap.servers", kafka_bootstrap).option("topic", topic).save())
        return seen

    assert observed_write().get == {"n": 3}
    default = spark.conf.get("spark.sql.sources.useV1SourceList")
    spark.conf.set("spark.sql.sources.useV1SourceList", f"{default},kafka")
    try:
        seen, got = observed_write(), []
        waiting = threading.Thread(target=lambda: got.append(seen.get), daemon=True)
        waiting.start()
        waiting.join(3)   # the V2 writer's is there when save() returns
        assert not got, "the V1 writer reports an Observation now: useV1SourceList can go"
    finally:
        spark.conf.set("spark.sql.sources.useV1SourceList", default)


def test_kafka_python_round_trip_with_headers(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    headers = [("REAL_TOPIC", b"orders"), ("trace", b"\x00\xff"), ("trace", b"second")]
    producer.send(topic, key=b"k1", value=b"v1", headers=headers, partition=1).get(timeout=30)
    producer.close()
    [record] = consume_all(kafka_bootstrap, topic, expected=1)
    assert (record.key, record.value, record.partition) == (b"k1", b"v1", 1)
    assert list(record.headers) == headers, "headers keep their order, duplicates and bytes"


def test_spark_reads_headers_and_writes_per_row_topic_partition_headers(
        spark, kafka_bootstrap, new_topic, work_dir):
    from pyspark.sql import functions as F

    source, out_a, out_b = new_topic(partitions=1), new_topic(partitions=3), new_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(6):
        target = out_a if i % 2 == 0 else out_b
        producer.send(source, key=f"k{i}".encode(), value=f"v{i}".encode(),
                      headers=[("target", target.encode()), ("qid", str(i % 3).encode()),
                               ("user", f"u{i}".encode())])
    producer.flush()
    producer.close()

    rows = (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load())
    header = lambda name: F.expr(f"cast(filter(headers, h -> h.key = '{name}')[0].value as string)")
    out = rows.select(
        header("target").alias("topic"),
        F.when(header("target") == out_a, header("qid").cast("int")).alias("partition"),
        "key", "value",
        F.expr("filter(headers, h -> h.key = 'user')").alias("headers"),
    )
    query = (out.writeStream.format("kafka")
             .option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("checkpointLocation", str(work_dir / f"ckpt-{source}"))
             .start())
    try:
        got_a = consume_all(kafka_bootstrap, out_a, expected=3, timeout_s=90)
        got_b = consume_all(kafka_bootstrap, out_b, expected=3, timeout_s=30)
    finally:
        query.stop()
    assert sorted((r.key, r.value, r.partition) for r in got_a) == [
        (b"k0", b"v0", 0), (b"k2", b"v2", 2), (b"k4", b"v4", 1)]
    assert sorted(r.key for r in got_b) == [b"k1", b"k3", b"k5"]
    for record in got_a + got_b:
        index = record.key.decode()[1:]
        assert list(record.headers) == [("user", f"u{index}".encode())]


def test_delta_table_written_and_read_back(spark, work_dir):
    path = str(work_dir / "delta-roundtrip")
    spark.createDataFrame([(1, "a"), (2, "b")], "id int, name string") \
        .write.format("delta").save(path)
    spark.createDataFrame([(3, "c")], "id int, name string") \
        .write.format("delta").mode("append").save(path)
    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    assert [(r.id, r.name) for r in rows] == [(1, "a"), (2, "b"), (3, "c")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert len(history) == 2
