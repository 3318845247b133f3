"""The cold tier's roll after downtime: every bucket that came within the horizon while the job
was down rolls in one pass, each tombstone leaving out its own bucket's message only."""
from __future__ import annotations

import pytest
from pyspark.sql import types as T

from dataclasses import replace

from sinks.base import BatchSummary
from sinks.cold import ColdTier
from state.envelope import Kind, parse
from state.errors import JobError
from streaming.kafka.admin import admin_client, end_offsets
from streaming.kafka.config import spark_options
from streaming.stages import rules_of
from tests.support import consume_all, header_map

BUCKET, HORIZON = 2_000, 10_000
HEADERS = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                    T.StructField("value", T.BinaryType())]))
SCHEMA = T.StructType([
    T.StructField("uniq_key", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()), T.StructField("headers", HEADERS),
    T.StructField("level", T.IntegerType()), T.StructField("due_ms", T.LongType()),
    T.StructField("append_ms", T.LongType()), T.StructField("ipart", T.IntegerType()),
    T.StructField("ioff", T.LongType()), T.StructField("tombstone", T.StringType()),
    T.StructField("due_bucket", T.LongType())])


def row(key: str, due_ms: int, tombstone: str | None = None, topic: str | None = "real"):
    return (key, None if tombstone else topic, None, None, None if tombstone else key.encode(),
            None, 3, due_ms, 0, 0, 0, tombstone, due_ms - due_ms % BUCKET)


def test_buckets_due_while_down_roll_in_one_pass_with_their_own_tombstones(
        spark, test_settings, new_topic, kafka_bootstrap, tmp_path):
    intake = new_topic(partitions=3)
    now = [100.0]   # seconds: the horizon's edge at 110 s, bucket 110,000 ms
    key = "5e" * 32
    cold = ColdTier(spark, tmp_path / "cold", str(tmp_path / "ckpt"), intake,
                    spark_options(test_settings), bucket_ms=BUCKET, horizon_ms=HORIZON,
                    seal_key=key, intake_ends=lambda: {}, clock=lambda: now[0])
    assert cold.loaded_until() == 110_000
    rows = [row("a", 112_500), row("b", 114_100), row("c", 116_900),
            row("b", 114_100, tombstone="waiting"),     # cancels b in its own bucket
            row("c", 112_200, tombstone="waiting"),     # a c in another bucket: not this c
            row("gone", 113_000, tombstone="waiting"),  # its message never came: a miss
            row("later", 121_000)]                      # beyond the new horizon: stays
    (spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("due_bucket")
     .save(str(tmp_path / "cold")))
    now[0] = 108.0   # down 8 s: the edge at 118 s, four buckets due
    summary = BatchSummary(1)
    assert cold.advance(summary) == 4
    assert cold.loaded_until() == 118_000
    records = consume_all(kafka_bootstrap, intake, expected=2, timeout_s=30, idle_s=3)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in records) == ["a", "c"]
    # The seal made in Spark SQL is the one the parse checks in Python, and only with its key.
    rules = rules_of(test_settings, key)
    for r in records:
        got = parse(r.headers, r.partition, r.offset, r.timestamp, rules, r.timestamp)
        assert got.kind != Kind.DEAD and (got.rolled, got.level, got.due_ms) == (
            True, 3, int(header_map(r)["TIMER_DELIVER_MS"])), got
        other = parse(r.headers, r.partition, r.offset, r.timestamp,
                      replace(rules, seal_key="0" * 64), r.timestamp)
        assert other.kind == Kind.DEAD and other.reason.startswith("forged_header"), other
    assert summary.count("cancelled") == 1 and summary.pending_delta_by_level == {3: -1}
    assert summary.count("cancel_unknown") == 2, "the c of another bucket and gone"
    assert cold.advance(BatchSummary(2)) == 0, "nothing more until the clock moves"
    # The marker lost (a store that dropped it) with messages parked: never made again at the
    # horizon, which would skip the buckets not rolled yet.
    cold.marker.unlink()
    again = ColdTier(spark, tmp_path / "cold", str(tmp_path / "ckpt"), intake, {},
                     bucket_ms=BUCKET, horizon_ms=HORIZON, seal_key=key, intake_ends=lambda: {},
                     clock=lambda: now[0])
    with pytest.raises(JobError, match="marker .* is missing, and .* holds parked messages"):
        again.loaded_until()
    assert not cold.marker.exists()


def test_a_roll_cut_short_is_done_again_without_what_it_wrote(
        spark, test_settings, new_topic, kafka_bootstrap, tmp_path):
    """A roll that wrote some of its messages and stopped (a crash before the marker moved on)
    is done again at the next start: the rest roll, the ones written stay once. A record a
    producer wrote with the same UNIQ_KEY, due time and a forged mark leaves nothing out. So
    with a batch's message for a bucket rolled already (the wheel behind), rolled at once: the
    batch run again after a crash rolls it once."""
    import json

    from kafka import KafkaProducer

    intake = new_topic(partitions=2)
    admin = admin_client(test_settings)
    now, key = [100.0], "7f" * 32

    def tier() -> ColdTier:
        return ColdTier(spark, tmp_path / "cold", str(tmp_path / "ckpt"), intake,
                        spark_options(test_settings), bucket_ms=BUCKET, horizon_ms=HORIZON,
                        seal_key=key, intake_ends=lambda: end_offsets(admin, intake),
                        clock=lambda: now[0])
    cold = tier()
    assert cold.loaded_until() == 110_000
    rows = [row("a", 112_500), row("b", 113_100), row("c", 115_000)]
    (spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("due_bucket")
     .save(str(tmp_path / "cold")))
    now[0] = 106.0   # the edge at 116 s: all three due to roll
    # The roll began (its marker) and wrote a and b, then stopped.
    cold._set_loaded(110_000, {"until": 116_000, "from": end_offsets(admin, intake)})
    table = spark.read.format("delta").load(str(tmp_path / "cold"))
    cold.roll(table.filter("uniq_key in ('a', 'b')"), BatchSummary(1))
    forged = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    forged.send(intake, b"c", partition=0, headers=[
        ("REAL_TOPIC", b"real"), ("UNIQ_KEY", b"c"), ("TIMER_DELIVER_MS", b"115000"),
        ("DELAYQ_ROLLED", b"3:" + b"0" * 32)]).get(timeout=30)
    # A record without UNIQ_KEY (a heartbeat's like) is read past, not failed on.
    forged.send(intake, b"other", partition=1, headers=[("trace", b"x")]).get(timeout=30)
    forged.close()
    assert tier().advance(BatchSummary(2)) == 3
    assert json.loads(cold.marker.read_text()) == {"loaded_until": 116_000}
    late = spark.createDataFrame([row("d", 113_500)], SCHEMA)   # its bucket rolled already
    tier()._roll_now(late, BatchSummary(3))
    again = tier()   # the batch run again after a crash before its `advance`
    again._roll_now(late, BatchSummary(3))
    assert again.advance(BatchSummary(3)) == 0
    assert json.loads(cold.marker.read_text()) == {"loaded_until": 116_000}
    records = consume_all(kafka_bootstrap, intake, expected=6, timeout_s=30, idle_s=3)
    rules = rules_of(test_settings, key)
    good = [parse(r.headers, r.partition, r.offset, r.timestamp, rules, r.timestamp)
            for r in records if r.value != b"other"]
    assert sorted(e.uniq_key for e in good if e.kind != Kind.DEAD) == ["a", "b", "c", "d"]
    assert [e.reason.split(":")[0] for e in good if e.kind == Kind.DEAD] == ["forged_header"]
