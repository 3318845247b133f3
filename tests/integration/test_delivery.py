"""Delay-level delivery end to end, on the real broker and real Spark (levels "1s 2s 3s")."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer

from state.errors import JobError
from streaming.kafka.admin import ensure_topics
from streaming.wheel.query import pending_by_level, wheel_state
from streaming.wheel.offsets import delay_offset_table
from streaming.producer import DelayProducer
from tests.integration.conftest import Sent
from tests.support import LATE_MS, assert_eventually, check_deliveries, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def send(producer: DelayProducer, sent: dict, topic: str, value: bytes, *, key=None,
         level=0, partition=None, headers=(), delay_ms: int = 0):
    handle = producer.send(topic, value, key=key, level=level, partition=partition,
                           headers=headers)
    sent[handle.uniq_key] = Sent(key, value, list(headers), handle.due_ms, partition)
    return handle


def test_every_level_on_time_and_exactly_as_sent(job_settings, start_job, new_topic,
                                                 kafka_bootstrap, lateness_log, spark):
    settings = job_settings()
    real = new_topic(partitions=3, **LOG_APPEND)
    job = start_job(settings)
    sent: dict = {}
    user_headers = [("trace", b"t-1"), ("bin", b"\x00\xff\xfe"), ("trace", b"t-2")]
    with DelayProducer(settings) as producer:
        for level in (0, 1, 2, 3):
            for qid in (None, 0, 2):
                send(producer, sent, real, f"level {level} qid {qid}".encode(),
                     key=f"key-{level}".encode(), level=level, partition=qid,
                     headers=user_headers)
    # The service clamps, not only the client: a raw DELAY=9 waits the longest level (3 s).
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    meta = raw.send(settings.intake_topic, b"level 9 is clamped to 3", partition=2,
                    headers=[("REAL_TOPIC", real.encode()), ("DELAY", b"9"),
                             ("UNIQ_KEY", b"clamped")]).get(timeout=30)
    raw.close()
    sent["clamped"] = Sent(None, b"level 9 is clamped to 3", [], meta.timestamp + 3_000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent, lateness_log=lateness_log)
    # Every batch dropped the rows it kept (streaming.wheel.query.kept): after a few batches, at
    # most the one under way holds any.
    assert_eventually(lambda: (job.query.lastProgress or {}).get("batchId", -1) >= 3,
                      timeout_s=60, message="a fourth batch")
    assert len(kept_batches(spark)) <= 1


def kept_batches(spark) -> list[int]:
    """Ids of the RDDs Spark holds as local checkpoints (the batches `kept` keeps)."""
    held = spark.sparkContext._jsc.getPersistentRDDs()
    return [int(i) for i in held.keySet() if held.get(i).rdd().isLocallyCheckpointed()]


def test_a_level_shorter_than_the_fire_lead_skips_the_wheels_state(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log):
    """At the default fire lead (12 s) a message due within the lead of the watermark when it
    is read fires in the batch that reads it: a 6 s level's messages wait in their dispatch task,
    on time and never early, without a trip through the wheel's state (no batch adds them to
    its pending count). With a lead of 4 s each one would wait in the state for a batch or more
    (docs/performance.md, `fire_lead_ms`)."""
    settings = job_settings(delay_levels="1s 6s")
    assert settings.fire_lead_ms == 12_000, "the default lead"
    real = new_topic(**LOG_APPEND)
    summaries: list = []
    start_job(settings, on_batch=summaries.append)
    sent: dict = {}
    with DelayProducer(settings) as producer:
        for i in range(20):
            send(producer, sent, real, f"six {i}".encode(), level=2)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=2)
    check_deliveries(records, sent, lateness_log=lateness_log)
    assert sum(s.received_by_level.get(2, 0) for s in summaries) == 20
    held = [(s.batch_id, s.pending_delta_by_level[2]) for s in summaries
            if s.pending_delta_by_level.get(2)]
    assert not held, f"level-2 messages went into the state: {held}"


def test_idle_intake_still_delivers(job_settings, start_job, new_topic, kafka_bootstrap,
                                    lateness_log):
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    sent: dict = {}
    with DelayProducer(settings) as producer:
        send(producer, sent, real, b"alone", level=3)
    # Nothing else is produced: only the job's heartbeat moves time.
    records = consume_all(kafka_bootstrap, real, expected=1, timeout_s=60)
    check_deliveries(records, sent, lateness_log=lateness_log)


def _job_on_overdue_backlog(settings, real, start_job, kafka_bootstrap,
                            restart_after: int | None = None, checkpoint: str | None = None,
                            late_ms: int = LATE_MS) -> list:
    """30 level messages over levels 1-3 and a timer due 12 s after it is sent, on an intake
    no job has read; a new job started once the 30 are overdue (stopped once it has taken in
    `restart_after` of them, and started again on its checkpoint). Checks that all arrive, as
    sent, never early, and each level in due order (they name the partition, `REAL_QID`: order
    is kept per named partition and per key); returns the batch summaries of every run."""
    ensure_topics(settings)
    sent: dict = {}
    with DelayProducer(settings) as producer:
        for i in range(30):
            send(producer, sent, real, f"overdue {i}".encode(), level=1 + i % 3, partition=0)
        later = producer.send(real, b"later", deliver_at_ms=int(time.time() * 1000) + 12_000)
    sent[later.uniq_key] = Sent(None, b"later", [], later.due_ms)
    time.sleep(3.5)  # the longest level is 3 s: all 30 are overdue when the job starts
    summaries: list = []
    job = start_job(settings, checkpoint=checkpoint, on_batch=summaries.append)
    up_ms = int(time.time() * 1000)   # the backlog is overdue: late from here
    if restart_after is not None:
        taken = lambda: sum(s.received_by_level.get(lv, 0) for s in summaries for lv in (1, 2, 3))
        assert_eventually(lambda: taken() >= restart_after, timeout_s=60,
                          message=f"{restart_after} of the backlog taken in")
        job.stop()
        assert taken() < 30, "the backlog was still being read when the job stopped"
        start_job(settings, checkpoint=checkpoint, on_batch=summaries.append)
        up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent, late_ms=late_ms, after_ms=up_ms)
    due_by_level: dict[int, list] = {}
    for record in sorted(records, key=lambda r: r.offset):
        uniq = header_map(record)["UNIQ_KEY"].decode()
        if uniq != later.uniq_key:
            level = 1 + int(record.value.split()[1]) % 3
            due_by_level.setdefault(level, []).append(sent[uniq].due_ms)
    assert all(dues == sorted(dues) for dues in due_by_level.values()), due_by_level
    return summaries


def test_a_new_job_delivers_what_is_overdue_at_its_start_in_its_first_batch(
        job_settings, start_job, new_topic, kafka_bootstrap):
    """A job started on an intake that already holds overdue messages (a first deployment, a
    new checkpoint) sends them in its first batch, in due order per level, not a batch later
    through the state. A timer due 12 s after it was sent is never early, whichever batch
    fires it (a first batch fires what is due up to the job's start plus the fire lead, and
    its dispatch task keeps it until due)."""
    settings = job_settings()
    summaries = _job_on_overdue_backlog(settings, new_topic(partitions=1, **LOG_APPEND),
                                        start_job, kafka_bootstrap)
    first = summaries[0]
    assert first.batch_id == 0
    # Fired by the first batch, not left in the state for a later one: the 20 of levels 2 and
    # 3 (level 1's are the dispatch tasks' own, read from the intake; the wheel never sees them).
    assert first.count("deliver") >= 20, f"batch 0 fired {first.count('deliver')} of the 20"
    assert first.received_by_level.get(2) == 10 and not first.received_by_level.get(1)


def test_a_backlog_read_over_many_batches_never_enters_the_state(
        job_settings, start_job, new_topic, kafka_bootstrap):
    """The same backlog read a few records a batch: level messages due before the checkpoint's
    first start pass through as they are read, in every batch, not only the first; none is
    ever pending in the state, and each level still leaves in due order."""
    settings = job_settings(max_offsets_per_trigger=6)
    # Six records a batch, heartbeats included: the backlog's last leaves many batches in.
    summaries = _job_on_overdue_backlog(settings, new_topic(partitions=1, **LOG_APPEND),
                                        start_job, kafka_bootstrap, late_ms=30_000)
    taking = [s for s in summaries if any(s.received_by_level.get(lv) for lv in (1, 2, 3))]
    assert len(taking) >= 3, f"the backlog was read over {len(taking)} batches"
    pending = [(s.batch_id, s.pending_delta_by_level) for s in taking
               if any(s.pending_delta_by_level.get(lv, 0) > 0 for lv in (1, 2, 3))]
    assert not pending, f"overdue level messages went into the state: {pending}"


def test_a_backlog_keeps_passing_through_after_a_restart_on_its_checkpoint(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Stopped half way through the backlog and started again on its checkpoint, the job takes
    the checkpoint's first start from its stamp, not its own: the rest of the backlog, due
    before that moment, still passes through, and each level stays in due order."""
    settings = job_settings(max_offsets_per_trigger=3)
    checkpoint = str(work_dir / f"ckpt-backlog-{settings.intake_topic}")
    summaries = _job_on_overdue_backlog(settings, new_topic(partitions=1, **LOG_APPEND),
                                        start_job, kafka_bootstrap, restart_after=6,
                                        checkpoint=checkpoint, late_ms=30_000)   # 3 a batch
    pending = [(s.batch_id, s.pending_delta_by_level) for s in summaries
               if any(s.pending_delta_by_level.get(lv, 0) > 0 for lv in (1, 2, 3))]
    assert not pending, f"overdue level messages went into the state: {pending}"


def test_an_overdue_backlog_leaves_each_intake_partition_s_messages_in_due_order(
        job_settings, start_job, new_topic, kafka_bootstrap):
    """One intake partition has one sender, its ready lane's dispatch task (sinks/ready.py),
    which sends in due order: a backlog overdue at the job's start (levels 1-3 mixed, on their
    three intake partitions, so due order is not send order) leaves each key's and each named
    partition's messages of one sender in due order, all of them, none early."""
    settings = job_settings()
    real = new_topic(partitions=2, **LOG_APPEND)
    ensure_topics(settings)
    sent: dict = {}
    lane_of: dict = {}   # UNIQ_KEY → its sender: its level's intake partition's ready lane
    with DelayProducer(settings) as producer:
        for i in range(80):
            level = 3 - (i // 6) % 3   # each lane's later sends due sooner
            if i % 2:
                handle = send(producer, sent, real, f"keyed {i}".encode(),
                              key=f"k{i % 6}".encode(), level=level)
            else:
                handle = send(producer, sent, real, f"named {i}".encode(),
                              partition=(i // 2) % 2, level=level)
            lane_of[handle.uniq_key] = (level - 1) % settings.ready_partitions
    time.sleep(3.5)  # the longest level is 3 s: all are overdue when the job starts
    start_job(settings)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent, after_ms=up_ms)

    def lanes_of(rows) -> dict:
        lanes: dict = {}
        for uniq, key, partition, due_ms in rows:
            where = ("key", key) if key else ("partition", partition)
            lanes.setdefault((where, lane_of[uniq]), []).append(due_ms)
        return lanes
    as_sent = lanes_of((u, s.key, s.partition, s.due_ms) for u, s in sent.items())
    assert len(as_sent) == (3 + 2) * 2 and any(d != sorted(d) for d in as_sent.values()), \
        "each lane's messages were sent out of due order"
    delivered = lanes_of((u, r.key, None if r.key else r.partition, sent[u].due_ms)
                         for r in sorted(records, key=lambda r: (r.partition, r.offset))
                         for u in [header_map(r)["UNIQ_KEY"].decode()])
    assert delivered.keys() == as_sent.keys()
    assert all(dues == sorted(dues) for dues in delivered.values()), delivered


def restart_after_a_clean_stop(settings, checkpoint: str, start_job, bootstrap: str, real: str,
                               sent: dict) -> None:
    """After a clean stop the restart runs the batch Spark had planned and never began (its
    Kafka source reports that batch's progress without failing the query: SPARK-55271, fixed
    in Spark 4.2.0's connector), and every message arrives once, never early."""
    restarted = start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)   # what fell due while it was down is late from here
    check_deliveries(consume_all(bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3),
                     sent, after_ms=up_ms)
    assert restarted.query.isActive, restarted.query.exception()


def stop_during_a_write(job, settings, real: str, sent: dict, *, hold, after_write=False,
                        grace_s: float = 30.0, stop=None) -> int:
    """Send 20 messages and ask `job` to stop (`job.stop(grace_s)`, or `stop()`) from inside a
    batch's Kafka write: the stop starts on its own thread, then `hold(batch)` runs there,
    before the write of the next batch, or `after_write` of the first that delivered. Returns
    that batch's id once the stop returned and the query ended without an error."""
    kafka = job._writer.kafka
    write, asked = kafka.write_batch, []
    stopper = threading.Thread(target=stop or (lambda: job.stop(grace_s=grace_s)),
                               name="test-stop")

    def stop_here(batch, summary):
        asked.append(summary.batch_id)
        stopper.start()
        hold(batch)

    def write_batch(batch, summary, *rest):
        if not after_write and not asked:
            stop_here(batch, summary)
        written = write(batch, summary, *rest)
        if after_write and not asked and summary.count("deliver"):
            stop_here(batch, summary)
        return written

    kafka.write_batch = write_batch
    with DelayProducer(settings) as producer:
        for i in range(20):   # levels 2 and 3: the wheel's (level 1's go around it)
            send(producer, sent, real, f"stop {i}".encode(), level=2 + i % 2)
    assert_eventually(lambda: asked, timeout_s=30, message="a batch under way")
    stopper.join(timeout=90)
    assert not stopper.is_alive(), "the stop returned"
    # The query's thread has ended (not only been asked to: see the stuck thread's test).
    assert job.query.awaitTermination(60), "the query's thread ended"
    assert job.query.exception() is None, job.query.exception()
    return asked[0]


def test_a_stop_asked_during_a_batch_lets_it_finish_and_sends_nothing_twice(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """A stop asked while a batch is under way (here: just before its Kafka write) waits for
    that batch to be sent and committed, lets no other begin, and leaves the query stopped
    cleanly; started again on its checkpoint, the job sends every message once. Without the
    wait, the query's stop interrupts the write and the batch runs again after the restart."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-stop-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    # The stop is asked and waiting by the time the write begins.
    under_way = stop_during_a_write(job, settings, real, sent := {},
                                    hold=lambda batch: time.sleep(1.5))
    commits = Path(checkpoint) / "commits"
    assert (commits / str(under_way)).is_file(), \
        f"batch {under_way} was under way when the stop was asked and was not committed"
    restart_after_a_clean_stop(settings, checkpoint, start_job, kafka_bootstrap, real, sent)


def test_a_batch_begun_after_the_stop_was_asked_sends_nothing(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Once a stop is asked, the next batch waits for it without sending; the stop ends the
    query cleanly (no error), and that batch's messages go after the restart."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-park-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    last = job._writer.close()   # what DelayJob.stop does first; a batch under way goes on
    sent: dict = {}
    with DelayProducer(settings) as producer:
        for i in range(10):   # level 2: the wheel's (level 1's go around it, streaming/dispatch/direct.py)
            send(producer, sent, real, f"after {i}".encode(), level=2)
    assert consume_all(kafka_bootstrap, real, expected=1, timeout_s=8) == []
    assert job.query.isActive and job.query.lastProgress["batchId"] <= last
    job.stop()
    assert job.query.exception() is None, job.query.exception()
    restart_after_a_clean_stop(settings, checkpoint, start_job, kafka_bootstrap, real, sent)


@pytest.mark.parametrize("where", ["spark", "python"])
def test_a_batch_that_outlasts_the_stops_grace(job_settings, start_job, new_topic,
                                               kafka_bootstrap, work_dir, caplog, where):
    """A batch still under way when the stop's grace runs out: the stop says so and stops the
    query, which interrupts the batch's thread. Cut in Spark's work (here a wait in the JVM
    after its Kafka write), the batch is not committed and the restart runs it again: it fires
    its messages into the ready topic again, and the dispatch tasks skip those their ledger
    holds as sent. In Python code, which the interruption cannot reach, the stop waits for the
    batch to end and be committed. Either way the query ends without an error, the restarted
    query runs on past its first batch, and every message arrives once, never early."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-grace-{where}-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)

    def hold(batch):   # sent, and still under way when the grace runs out
        if where == "spark":   # a Spark job's wait, on the query's thread
            batch.sparkSession._jvm.java.lang.Thread.sleep(5000)
        else:
            time.sleep(5)

    sent: dict = {}
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        cut = stop_during_a_write(job, settings, real, sent, hold=hold, after_write=True,
                                  grace_s=1.0)
    assert f"batch {cut} still under way 1 s after the stop was asked" in caplog.text
    committed = (Path(checkpoint) / "commits" / str(cut)).exists()
    assert committed == (where == "python"), f"batch {cut} committed: {committed}"
    # Stopped: what it sent is there now; those not yet due are not.
    before = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=3, idle_s=1)
    assert before, "the batch had sent its messages before the grace ran out"
    first = {(r.partition, r.offset) for r in before}

    # The cut batch runs again as the restarted query's first batch, and the query goes on
    # (Spark 4.1's Kafka stream failed the query after such a batch: SPARK-55271).
    restarted = start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent, after_ms=up_ms)
    assert first <= {(r.partition, r.offset) for r in records}
    assert restarted.query.isActive, restarted.query.exception()


def test_a_stop_whose_query_thread_does_not_end_says_where_it_is(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir, caplog):
    """A batch busy in Python code past the stop's grace and past its wait for the query's
    thread (here 1 s and 2 s; 30 s each by default): the stop does not wait for ever. It logs
    the thread's stack (Spark's stop time-out carries it), does the rest of the stop and raises.
    The batch here ends by itself later; after the restart every message arrives, never early,
    and any sent twice with the same UNIQ_KEY."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-stuck-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    raised, took = [], []

    def stop():
        t0 = time.monotonic()
        try:
            job.stop(grace_s=1.0, thread_s=2.0)
        except JobError as e:
            raised.append(e)
        took.append(time.monotonic() - t0)

    sent: dict = {}
    with caplog.at_level(logging.ERROR, logger="streaming.job"):
        stop_during_a_write(job, settings, real, sent, hold=lambda batch: time.sleep(12),
                            after_write=True, stop=stop)
    assert raised and "did not end within 2 s of the stop" in str(raised[0]), raised
    assert took[0] < 10, f"the stop took {took[0]:.1f} s, not its grace and thread wait"
    # The thread's stack, as Spark's time-out gives it: the batch's Python callback.
    assert "The stream thread was last executing" in caplog.text, caplog.text[-2000:]
    assert "foreachBatch" in caplog.text or "ForeachBatch" in caplog.text, caplog.text[-2000:]

    start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    once = {}
    for record in records:   # a copy sent twice is the same message with the same UNIQ_KEY
        once.setdefault((header_map(record)["UNIQ_KEY"], record.value), record)
    check_deliveries(list(once.values()), sent, after_ms=up_ms)


def test_timers_added_to_held_groups_in_a_later_batch_are_held_as_references_and_delivered(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir, spark):
    """Timers of one slot sent in two batches: the second batch's join the first's in their
    groups' state, which holds only references (each one's intake partition and offset, append
    and due time, UNIQ_KEY: no body), as Spark's state store keeps them; the timeouts release
    every one, restored whole from the intake by the dispatch tasks, none early."""
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-refs-{settings.intake_topic}")
    start_job(settings, checkpoint=checkpoint)
    due = (int(time.time() * 1000) // 1000 + 25) * 1000 + 500   # one slot, well past the lead
    sent: dict = {}
    for first in (0, 16):
        with DelayProducer(settings) as producer:
            for i in range(first, first + 16):
                value = f"timer {i} ".encode() + b"x" * 2_000
                handle = producer.send(real, value, deliver_at_ms=due, headers=[("n", b"%d" % i)])
                sent[handle.uniq_key] = Sent(None, value, [("n", b"%d" % i)], handle.due_ms)
        assert_eventually(lambda: sum(pending_by_level(spark, checkpoint).values()) >= first + 16,
                          timeout_s=60, message=f"{first + 16} timers held in the state")
    held = wheel_state(spark, checkpoint)
    assert set(held.columns) == {"bucket", "slot", "count", "ipart", "ioff", "append_ms",
                                 "due_ms", "uniq_key"}, "references only"
    keys = sorted(k for r in held.collect() for k in r["uniq_key"])
    assert keys == sorted(sent)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent)


def test_missing_uniq_key_is_assigned_and_stable_across_replays(
        job_settings, start_job, new_topic, kafka_bootstrap, spark, work_dir):
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    positions = []
    for level in (b"0", b"2"):
        meta = producer.send(settings.intake_topic, b"no id",
                             headers=[("REAL_TOPIC", real.encode()), ("DELAY", level)],
                             partition=1).get(timeout=30)
        positions.append(f"{meta.partition}-{meta.offset}")
    producer.close()
    first = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in first) == sorted(positions)

    # A replay (the wheel reading the same intake from scratch on a new checkpoint) fires them
    # with the same ids.
    from pyspark.sql import functions as F

    from streaming.stages import rules_of, wheel_config_of
    from streaming.wheel.query import intake_stream, wheel_stream

    fired: list = []
    now_ms = int(time.time() * 1000)
    # The wheel alone, every level through it (the dispatch tasks read level 0 themselves).
    alone = settings.model_copy(update={"dispatch_direct_max_delay_ms": -1})
    query = (wheel_stream(intake_stream(spark, alone), rules_of(alone, ""),
                          wheel_config_of(alone, first_watermark_ms=now_ms),
                          overdue_before_ms=now_ms)
             .writeStream.queryName(f"replay-{settings.intake_topic}")
             .foreachBatch(lambda batch, _: fired.extend(
                 r.uniq_key for r in batch.filter(F.col("kind") == "deliver")
                 .select("uniq_key").collect()))
             .option("checkpointLocation", str(work_dir / f"ckpt-replay-{settings.intake_topic}"))
             .trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 120
        while len(fired) < 2 and time.monotonic() < deadline and query.isActive:
            time.sleep(0.5)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert sorted(fired) == sorted(positions)


def test_restart_keeps_pending_messages_and_offsets_agree(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Pending messages survive a stop in the wheel's state."""
    # In the wheel's state when the job stops: at the default lead (12 s) these 12 s messages
    # would fire in the next batch, into the ready topic, instead of waiting in the state.
    settings = job_settings(delay_levels="1s 2s 12s", fire_lead_ms=4000)
    real = new_topic(partitions=2, **LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-restart-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    sent: dict = {}
    with DelayProducer(settings) as producer:
        for i in range(20):
            send(producer, sent, real, f"pending {i}".encode(), key=str(i).encode(), level=3)
        send(producer, sent, real, b"short", level=1)

    def in_state():
        table = delay_offset_table(__import__("pathlib").Path(checkpoint), settings.intake_topic)
        return table["offsetTable"].get("3") == 20 and table
    table = assert_eventually(in_state, timeout_s=60, message="level-3 messages taken in")
    assert table["offsetTable"]["2"] == 0, "nothing was sent at level 2"
    job.stop()
    assert consume_all(kafka_bootstrap, real, expected=21, timeout_s=3) .__len__() <= 1, \
        "level-3 messages must still be pending when the job stops"

    time.sleep(2)
    start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    records = consume_all(kafka_bootstrap, real, expected=21, timeout_s=90, idle_s=2)
    # Not in the lateness log: these fell due while the job was stopped, late by design.
    check_deliveries(records, sent, after_ms=up_ms)

    # delayOffset: level L's next intake offset = what was written to partition L-1.
    table = delay_offset_table(__import__("pathlib").Path(checkpoint), settings.intake_topic,
                               settings.heartbeat_partition)
    assert table["offsetTable"] == {"1": 1, "2": 0, "3": 20}, \
        "each level's own messages: the heartbeats have the partition after the levels'"
    beats = delay_offset_table(__import__("pathlib").Path(checkpoint), settings.intake_topic)
    assert beats["offsetTable"]["4"] > 0, "the heartbeats' partition, left out of the view"


def test_bad_input_goes_to_dead_letters_and_the_stream_keeps_flowing(
        job_settings, start_job, new_topic, kafka_bootstrap, lateness_log, spark):
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    bad = {
        b"no-topic": [("DELAY", b"1")],
        b"bad-level": [("REAL_TOPIC", real.encode()), ("DELAY", b"abc")],
        b"negative": [("REAL_TOPIC", real.encode()), ("DELAY", b"-1")],
        b"two-delays": [("REAL_TOPIC", real.encode()), ("DELAY", b"1"), ("TIMER_DELAY_MS", b"5")],
        b"intake": [("REAL_TOPIC", settings.intake_topic.encode()), ("DELAY", b"1")],
        b"missing": [("REAL_TOPIC", b"does-not-exist"), ("DELAY", b"1")],
        b"qid-range": [("REAL_TOPIC", real.encode()), ("REAL_QID", b"5"), ("DELAY", b"1")],
        b"utf8": [("REAL_TOPIC", b"\xff\xfe"), ("DELAY", b"1")],
    }
    for value, headers in bad.items():
        producer.send(settings.intake_topic, value, headers=headers, partition=0)
    producer.close()
    sent: dict = {}
    with DelayProducer(settings) as good:
        send(good, sent, real, b"good neighbour", level=1)
    dead = consume_all(kafka_bootstrap, settings.dlq_topic, expected=len(bad), timeout_s=60,
                       idle_s=2)
    reasons = {r.value: header_map(r)["DLQ_REASON"].decode() for r in dead}
    assert sorted(reasons) == sorted(bad), "each bad record dead-lettered exactly once"
    assert "REAL_TOPIC is missing" in reasons[b"no-topic"]
    assert "'abc' is not an integer" in reasons[b"bad-level"]
    assert "negative" in reasons[b"negative"]
    assert "more than one delay header" in reasons[b"two-delays"]
    assert "intake topic" in reasons[b"intake"]
    assert "does not exist" in reasons[b"missing"]
    assert "out of range" in reasons[b"qid-range"]
    assert "not valid UTF-8" in reasons[b"utf8"]
    records = consume_all(kafka_bootstrap, real, expected=1, timeout_s=30)
    check_deliveries(records, sent, lateness_log=lateness_log)

    # The dead-letter table holds the same records, once each, as they came and why. It is
    # written after the topic in the same batch, so give it a moment.
    def dead_rows():
        rows = spark.read.format("delta").load(str(settings.dead_letter_path)).collect()
        return rows if len(rows) >= len(bad) else None
    table = assert_eventually(dead_rows, timeout_s=30, message="dead-letter table rows")
    assert sorted(r["value"] for r in table) == sorted(bad)
    for row in table:
        assert row["reason"] == reasons[bytes(row["value"])]
        assert [(h["key"], bytes(h["value"])) for h in row["headers"]][:len(bad[bytes(row["value"])])] \
            == bad[bytes(row["value"])] or row["reason"].startswith(("unknown_topic: ", "partition_out_of_range: "))
        assert row["intake_partition"] == 0


def test_intake_without_log_append_time_is_refused(job_settings, spark, new_topic):
    from streaming.job import DelayJob

    intake = new_topic(partitions=3)  # CreateTime: producers' clocks would rule time
    settings = job_settings(intake_topic=intake, dlq_topic=f"{intake}.DLQ")
    job = DelayJob(settings, spark, checkpoint=f"/tmp/unused-{intake}")
    with pytest.raises(JobError, match="LogAppendTime"):
        job.start()
    job.stop()
