"""Cancels of timers parked in the cold tier survive a SIGKILL of the job and its restart: a
cancel parked beside its timer, a cancel that came before its timer, a cancel sent again after
the restart, and a cancel of a timer that rolled into the wheel after it; their neighbour with
the same due time is delivered on time: with the checkpoint and the cold table on a real S3 server
(s3proxy; a folder is the same Delta table through Hadoop's local file system, which
tests/integration/test_timers.py runs)."""
from __future__ import annotations

import json
import time
import uuid

from streaming.kafka.admin import admin_client, create_topic
from streaming.producer import DelayProducer
from tests.integration.test_timers import COLD, cancel_elsewhere
from tests.support import assert_eventually, consume_all, delta_rows, header_map, store_text


def test_cold_tier_cancels_hold_across_a_kill(job_process, spark, kafka_bootstrap, s3_store):
    # The roll 21 s before due (horizon and tolerance): room for a slow hour's batches after
    # the restart, and for the cancel sent after the roll to reach the wheel before it fires.
    on_s3 = {**s3_store, "store": f"s3a://delayq/cold-{uuid.uuid4().hex[:8]}"}
    job, settings = job_process(**{**COLD, "near_horizon": "20s", **on_s3})
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 1, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start()
    # Far enough out for a kill and a restart before the roll (restarted 47-50 s after the
    # first start, rolled 74 s after the sends, on a real S3 server too).
    due = (int(time.time() * 1000) // 1000 + 95) * 1000
    cancel_elsewhere(settings, kafka_bootstrap, "ahead", due)
    with DelayProducer(settings) as producer:
        kept = producer.send(real, b"kept", deliver_at_ms=due)
        waiting = producer.send(real, b"waiting", deliver_at_ms=due)
        producer.cancel(waiting)
        producer.send(real, b"ahead", deliver_at_ms=due, uniq_key="ahead")
        rolled = producer.send(real, b"rolled", deliver_at_ms=due)

    def tombstones() -> int:
        rows = delta_rows(spark, settings, str(settings.cold_path), ["tombstone"])
        return sum(row.get("tombstone") == "waiting" for row in rows)

    assert_eventually(lambda: tombstones() >= 2, timeout_s=60,
                      message="both cancels parked beside their timers")
    job.kill()
    job.start()
    restarted_ms = int(time.time() * 1000)
    with DelayProducer(settings) as producer:
        producer.cancel(waiting)          # sent again after the restart: harmless
    marker = f"{settings.checkpoint_path}/cold/loaded_until"
    assert_eventually(lambda: json.loads(store_text(settings, marker))["loaded_until"]
                      >= due - due % 2000,
                      timeout_s=90, message="the timers' bucket rolled into the wheel")
    assert int(time.time() * 1000) < due - 4_000, \
        f"rolled early enough to cancel in the wheel (restarted {due - restarted_ms} ms before due)"
    with DelayProducer(settings) as producer:
        producer.cancel(rolled)
    records = consume_all(kafka_bootstrap, real, expected=1, timeout_s=90, idle_s=5)
    delivered = [header_map(r)["UNIQ_KEY"].decode() for r in records]
    assert delivered == [kept.uniq_key], f"cancelled timers delivered: {delivered}"
    [record] = records
    assert due <= record.timestamp < due + 10_000, f"kept arrived {record.timestamp - due} ms late"
    job.stop()
