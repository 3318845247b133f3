"""The driver's hold (sinks/driver_hold.py, `hold = "driver"`): each row sent at its due time
after its batch, from a spool that survives a stop or a crash. On the real broker; the job's
own path on real Spark too."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import pyarrow as pa
from kafka.partitioner.default import murmur2

import pytest

from sinks.driver_hold import (RELEASED, SPOOL_FOLDER, SPOOLED, DriverHold, hand_over,
                               producer_config)
from state.errors import JobError
from state.columns import OUTPUT
from streaming.offsets import last_committed_batch
from streaming.producer import DelayProducer
from tests.integration.conftest import Sent
from tests.support import assert_eventually, check_deliveries, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def rows(topic: str, dues: list[int], *, tag: str = "m", partition: int | None = 0,
         key: bytes | None = None, kind: str = "deliver") -> pa.Table:
    """Spooled rows (SPOOLED columns) for `topic`, one per due time."""
    n = len(dues)
    uniq = [f"{tag}-{i}" for i in range(n)]
    columns = {
        "topic": [topic] * n, "partition": [partition] * n, "key": [key] * n,
        "value": [f"value {u}".encode() for u in uniq],
        "headers": [[{"key": "user", "value": b"u"}, {"key": "UNIQ_KEY", "value": u.encode()},
                     {"key": "DELIVER_MS", "value": str(d).encode()}]
                    for u, d in zip(uniq, dues)],
        "kind": [kind] * n, "uniq_key": uniq, "level": [2] * n, "ipart": [1] * n,
        "ioff": list(range(n)), "append_ms": [d - 5_000 for d in dues], "due_ms": dues,
    }
    return pa.table({name: pa.array(columns[name], OUTPUT.field(name).type)
                     for name in SPOOLED})


def hold(folder: Path, bootstrap: str, reports: list | None = None) -> DriverHold:
    on_sent = None if reports is None else (lambda *report: reports.append(report))
    return DriverHold(folder, producer_config(bootstrap), on_sent=on_sent)


def by_uniq(records) -> dict[str, object]:
    return {header_map(r)["UNIQ_KEY"].decode(): r for r in records}


def test_rows_leave_at_their_due_time_and_as_written(new_topic, kafka_bootstrap, tmp_path):
    topic = new_topic(partitions=3, **LOG_APPEND)
    now = int(time.time() * 1000)
    dues = [now - 1_000, now + 500, now + 1_500, now + 3_000]
    reports: list = []
    h = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=None)
    try:
        h.put(7, now, rows(topic, dues))
        h.put(8, now, rows(topic, [now + 200], tag="keyed", partition=None, key=b"k-17"))
        records = by_uniq(consume_all(kafka_bootstrap, topic, expected=5, timeout_s=30, idle_s=1))
        assert sorted(records) == ["keyed-0", "m-0", "m-1", "m-2", "m-3"]
        for i, due in enumerate(dues):
            record = records[f"m-{i}"]
            assert record.timestamp >= due, f"m-{i} {due - record.timestamp} ms early"
            assert (record.partition, record.key, record.value) == (0, None, f"value m-{i}".encode())
            assert [k for k, _ in record.headers] == ["user", "UNIQ_KEY", "DELIVER_MS"]
        # Each row leaves when due, not with the last of its file.
        assert records["m-1"].timestamp < dues[3], "m-1 waited for m-3"
        # No REAL_QID: placed by the key as Kafka's Java client (and Spark's writer) places it.
        assert records["keyed-0"].partition == (murmur2(b"k-17") & 0x7FFFFFFF) % 3
        # Each file reported once all its rows were acknowledged, in batch order, then deleted.
        assert_eventually(lambda: [r[0] for r in reports] == [7, 8], timeout_s=10)
        released = reports[0][2]
        assert released.column("uniq_key").to_pylist() == ["m-0", "m-1", "m-2", "m-3"]
        sent_ms = released.column("sent_ms").to_pylist()
        assert all(s >= d for s, d in zip(sent_ms, dues)), "released before due"
        assert_eventually(lambda: not list(tmp_path.glob("*.arrow")), timeout_s=10)
    finally:
        h.stop()


def released_by_tasks(table: pa.Table, sent_ms: int) -> pa.Table:
    """`table`'s deliveries as the batch's tasks report those they sent (RELEASED columns)."""
    return table.select(list(RELEASED[:-1])).append_column(
        "sent_ms", pa.array([sent_ms] * table.num_rows, pa.int64()))


def test_rows_the_tasks_sent_are_reported_with_the_rest_and_never_sent_again(
        new_topic, kafka_bootstrap, tmp_path):
    """A batch whose tasks sent what was due (`sent`) and left the rest to the hold: the hold
    sends only the rest, and reports the batch's deliveries together once Kafka has them all;
    after a crash before that, a restart sends the rest again, never the tasks' rows."""
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    by_tasks = released_by_tasks(rows(topic, [now - 2_000, now - 1_000], tag="tasks"), now - 900)
    crashed = hold(tmp_path, kafka_bootstrap)
    crashed.put(6, now, rows(topic, [now + 1_500], tag="later"), sent=by_tasks)
    crashed.put(7, now, None, sent=released_by_tasks(rows(topic, [now - 50], tag="only"), now))
    crashed.stop()   # its thread never started: a driver killed after the batches committed
    reports: list = []
    h = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=7)
    try:
        records = by_uniq(consume_all(kafka_bootstrap, topic, expected=1, timeout_s=30, idle_s=2))
        assert sorted(records) == ["later-0"], "the tasks' rows are not the hold's to send"
        assert records["later-0"].timestamp >= now + 1_500
        assert_eventually(lambda: [r[0] for r in reports] == [6, 7], timeout_s=10)
        released = reports[0][2]
        assert released.column("uniq_key").to_pylist() == ["tasks-0", "tasks-1", "later-0"]
        assert released.column("sent_ms").to_pylist()[:2] == [now - 900, now - 900]
        assert released.column("sent_ms")[2].as_py() >= now + 1_500
        assert reports[1][2].column("uniq_key").to_pylist() == ["only-0"]
        assert_eventually(lambda: not list(tmp_path.glob("*.arrow")), timeout_s=10)
    finally:
        h.stop()


def test_rows_the_tasks_handed_over_in_files_leave_when_due_and_are_reported_with_their_batch(
        new_topic, kafka_bootstrap, tmp_path):
    """Tasks that see the hold's hand-off folder write their rows not yet due there
    (`hand_over`) and report only the file's name; the batch's `put` takes the files into the
    spool beside its own file (the tasks' sent rows), and the batch is reported once, with
    every delivery of all its files, when Kafka has them all."""
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    reports: list = []
    h = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=None)
    try:
        first = hand_over(h.handoff_marker, [rows(topic, [now + 800, now + 1_600], tag="t1")])
        second = hand_over(h.handoff_marker, [rows(topic, [now + 400], tag="t2")])
        assert first and second and (h.handoff / first).exists()
        by_tasks = released_by_tasks(rows(topic, [now - 1_000], tag="sent"), now - 900)
        h.put(9, now, None, sent=by_tasks, files=[first, second])
        assert not (h.handoff / first).exists(), "taken into the spool"
        assert len(list(tmp_path.glob("0000000000000000009-*.arrow"))) == 3
        assert h.handed_over == {"files": 2, "rows": 3}
        records = by_uniq(consume_all(kafka_bootstrap, topic, expected=3, timeout_s=30, idle_s=1))
        assert sorted(records) == ["t1-0", "t1-1", "t2-0"], "the tasks' sent row is theirs"
        for name, due in (("t1-0", now + 800), ("t1-1", now + 1_600), ("t2-0", now + 400)):
            assert records[name].timestamp >= due, f"{name} {due - records[name].timestamp} ms early"
        assert_eventually(lambda: len(reports) == 1, timeout_s=10)
        batch_id, batch_time, released = reports[0]
        assert (batch_id, batch_time) == (9, now)
        assert sorted(released.column("uniq_key").to_pylist()) == ["sent-0", "t1-0", "t1-1", "t2-0"]
        assert_eventually(lambda: not list(tmp_path.glob("*.arrow")), timeout_s=10)
    finally:
        h.stop()
    assert not (h.handoff / Path(h.handoff_marker).name).exists(), "a stopped hold takes no files"
    assert hand_over(h.handoff_marker, [rows(topic, [now])]) is None, "the rows go in the report"


def test_files_handed_over_stay_with_their_batch_over_a_crash(new_topic, kafka_bootstrap,
                                                              tmp_path):
    """A driver killed after two batches took their tasks' files, the first committed: a
    restart sends the first batch's files (its time from the batch's own file) and drops the
    second's (Spark runs it again); what attempts Spark did not keep left in the hand-off
    folder goes with the batch that put after them, and the rest at the start."""
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    crashed = hold(tmp_path, kafka_bootstrap)
    Path(crashed.handoff_marker).touch()     # as its start would have
    names = [hand_over(crashed.handoff_marker, [rows(topic, [now + 300], tag=tag)])
             for tag in ("kept", "dropped")]
    failed = {batch: crashed.handoff / f"{batch}-0.0-deadbeef.arrow" for batch in (4, 6)}
    for path in failed.values():             # attempts Spark ran again elsewhere
        path.write_bytes(b"partial")
    crashed.put(4, now - 7, None, files=[names[0]])
    assert not failed[4].exists() and failed[6].exists()
    crashed.put(5, now, None, files=[names[1]])
    with pytest.raises(JobError, match="does not see"):
        crashed.put(6, now, None, files=["6-1.0-gone.arrow"])
    crashed.stop()
    reports: list = []
    h = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=4)
    try:
        assert [p.name for p in h.handoff.iterdir()] == [Path(h.handoff_marker).name]
        records = by_uniq(consume_all(kafka_bootstrap, topic, expected=1, timeout_s=30, idle_s=2))
        assert sorted(records) == ["kept-0"]
        assert_eventually(lambda: [r[:2] for r in reports] == [(4, now - 7)], timeout_s=10)
        assert reports[0][2].column("uniq_key").to_pylist() == ["kept-0"]
    finally:
        h.stop()


def test_a_restart_sends_what_is_overdue_in_due_order_across_files_before_it_returns(
        new_topic, kafka_bootstrap, tmp_path):
    """Files of consecutive batches overlap in due time; what a restart finds overdue leaves in
    due order over all of them (one partition: the log's order is the send order), and is in
    Kafka once `start` returns, before the run's first batch could send anything."""
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    crashed = hold(tmp_path, kafka_bootstrap)
    crashed.put(1, now, rows(topic, [now - 900, now - 600, now - 300, now + 60_000], tag="a"))
    crashed.put(2, now, rows(topic, [now - 800, now - 700, now - 100], tag="b"))
    crashed.stop()
    h = hold(tmp_path, kafka_bootstrap).start(last_committed=2)
    try:
        assert h.pending() == 1, "the six overdue acknowledged by the time start returned"
        records = consume_all(kafka_bootstrap, topic, expected=6, timeout_s=30, idle_s=0.5)
        assert [header_map(r)["UNIQ_KEY"].decode() for r in records] == \
            ["a-0", "b-0", "b-1", "a-1", "a-2", "b-2"]
    finally:
        h.stop()


def test_dead_letters_go_at_once_and_are_not_reported_as_deliveries(new_topic, kafka_bootstrap,
                                                                     tmp_path):
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    reports: list = []
    h = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=None)
    try:
        h.put(1, now, rows(topic, [now, now], kind="dead"))
        assert len(consume_all(kafka_bootstrap, topic, expected=2, timeout_s=30)) == 2
        assert_eventually(lambda: len(reports) == 1, timeout_s=10)
        assert reports[0][2].num_rows == 0
    finally:
        h.stop()


def test_a_stop_keeps_what_is_not_due_and_the_next_start_sends_only_that(new_topic,
                                                                        kafka_bootstrap, tmp_path):
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    dues = [now - 100, now, now + 6_000, now + 7_000]
    first = hold(tmp_path, kafka_bootstrap).start(last_committed=None)
    first.put(3, now, rows(topic, dues))
    assert len(consume_all(kafka_bootstrap, topic, expected=2, timeout_s=30)) == 2
    first.stop()
    assert [p.name.endswith(".sent") for p in sorted(tmp_path.glob("*.arrow*"))] == [False, True]
    reports: list = []
    again = hold(tmp_path, kafka_bootstrap, reports).start(last_committed=3)
    try:
        records = consume_all(kafka_bootstrap, topic, expected=4, timeout_s=30, idle_s=1)
        seen = [header_map(r)["UNIQ_KEY"].decode() for r in records]
        assert sorted(seen) == ["m-0", "m-1", "m-2", "m-3"], "each once: the stop recorded the two sent"
        for r in records:
            assert r.timestamp >= int(header_map(r)["DELIVER_MS"]), "never early"
        assert_eventually(lambda: len(reports) == 1, timeout_s=10)
        # The ledger's rows of the whole file, the two sent before the stop included.
        assert reports[0][2].column("uniq_key").to_pylist() == ["m-0", "m-1", "m-2", "m-3"]
        assert not list(tmp_path.glob("*.arrow*"))
    finally:
        again.stop()


def test_after_a_crash_a_committed_batch_is_sent_again_and_an_uncommitted_one_dropped(
        new_topic, kafka_bootstrap, tmp_path):
    """A hold whose thread never ran stands for a driver killed after spooling: batch 4 was
    committed, batch 5 not (Spark runs it again, and it spools anew)."""
    topic = new_topic(**LOG_APPEND)
    now = int(time.time() * 1000)
    crashed = hold(tmp_path, kafka_bootstrap)
    crashed.put(4, now, rows(topic, [now, now + 1_000], tag="committed"))
    crashed.put(5, now, rows(topic, [now], tag="replayed"))
    crashed.stop()   # its thread never started: this only closes its producer
    h = hold(tmp_path, kafka_bootstrap).start(last_committed=4)
    try:
        records = consume_all(kafka_bootstrap, topic, expected=2, timeout_s=30, idle_s=2)
        assert sorted(by_uniq(records)) == ["committed-0", "committed-1"]
    finally:
        h.stop()


def test_batches_wait_while_the_drivers_hold_is_behind_and_nothing_is_lost(
        job_settings, start_job, new_topic, kafka_bootstrap, monkeypatch, lateness_log):
    """The job's batches wait, before their work, while the driver's hold has more rows overdue
    than HOLD_BEHIND_ROWS (here 0, at most 1.5 s a batch): its sending thread is held back
    until the timers it took are due, and the batches run meanwhile report the wait; once the
    thread sends again, every timer arrives, none early."""
    import threading

    from streaming import job as job_module

    monkeypatch.setattr(job_module, "HOLD_BEHIND_ROWS", 0)
    monkeypatch.setattr(job_module, "HOLD_WAIT_S", 1.5)
    held_back = threading.Event()
    release = DriverHold._release

    def paused(self):
        if not held_back.is_set():
            release(self)
    monkeypatch.setattr(DriverHold, "_release", paused)
    # Fired 10 s ahead: in the driver's hold for seconds however slow the host's batches.
    settings = job_settings(hold="driver", fire_lead_ms=10_000)
    real = new_topic(**LOG_APPEND)
    summaries: list = []
    job = start_job(settings, on_batch=summaries.append)
    sent = {}
    with DelayProducer(settings) as producer:
        for i in range(3):
            handle = producer.send(real, f"timer {i}".encode(), delay_ms=15_000)
            sent[handle.uniq_key] = Sent(None, f"timer {i}".encode(), [], handle.due_ms, None)
    assert_eventually(lambda: job._hold.pending() == 3, timeout_s=60,
                      message="the timers in the driver's hold")
    held_back.set()
    assert_eventually(lambda: job._hold.overdue() == 3, timeout_s=30)
    begun = len(summaries)
    assert_eventually(lambda: any(s.timings.get("hold_wait", 0) >= 1.0
                                  for s in summaries[begun:]), timeout_s=30,
                      message="a batch that waited for the hold")
    held_back.clear()
    records = consume_all(kafka_bootstrap, real, expected=3, timeout_s=60, idle_s=2)
    check_deliveries(records, sent, lateness_log=lateness_log)
    assert_eventually(lambda: job._hold.overdue() == 0, timeout_s=10)


def test_the_job_delivers_through_the_drivers_hold(job_settings, start_job, new_topic, admin,
                                                   kafka_bootstrap, lateness_log):
    """`hold = "driver"` end to end: every level on time, never early, exactly once, as sent;
    the ledger has every delivery; the spool is empty once all are sent."""
    from streaming.admin import ensure_topics

    settings = job_settings(hold="driver", fire_lead_ms=4000)
    real = new_topic(partitions=3, **LOG_APPEND)
    sent: dict = {}
    user_headers = [("trace", b"t-1"), ("bin", b"\x00\xff\xfe")]
    # Due before the job starts: its first batch's tasks send these, the hold the rest.
    ensure_topics(settings, admin)
    with DelayProducer(settings) as producer:
        for i in range(5):
            handle = producer.send(real, f"overdue {i}".encode(), level=0, headers=user_headers)
            sent[handle.uniq_key] = Sent(None, f"overdue {i}".encode(), user_headers,
                                         handle.due_ms, None)
    time.sleep(1.2)
    job = start_job(settings)
    assert job._hold is not None
    with DelayProducer(settings) as producer:
        for level in (0, 1, 2, 3):
            for qid in (None, 0, 2):
                value = f"level {level} qid {qid}".encode()
                handle = producer.send(real, value, key=f"key-{level}".encode(), level=level,
                                       partition=qid, headers=user_headers)
                sent[handle.uniq_key] = Sent(f"key-{level}".encode(), value, user_headers,
                                             handle.due_ms, qid)
        # Fired 4 s ahead by a batch of its own, so not due when that batch's tasks split
        # their rows, however long the batch reading the levels above takes on a slow host.
        for delay in (12_000, 14_000):
            handle = producer.send(real, f"timer {delay}".encode(), delay_ms=delay,
                                   headers=user_headers)
            sent[handle.uniq_key] = Sent(None, f"timer {delay}".encode(), user_headers,
                                         handle.due_ms, None)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=3)
    check_deliveries(records, sent, lateness_log=lateness_log)
    assert_eventually(lambda: job._hold.pending() == 0, timeout_s=30)
    assert job._hold.sent_by["tasks"] >= 5, "the overdue ones went with their batch"
    assert job._hold.sent_by["hold"] > 0, job._hold.sent_by
    # Local tasks share the spool's folder: they handed their rows over in files.
    assert job._hold.handed_over["files"] > 0, job._hold.handed_over
    job.stop()
    from deltalake import DeltaTable
    ledger = DeltaTable(str(settings.ledger_path)).to_pyarrow_table()
    assert sorted(ledger.column("uniq_key").to_pylist()) == sorted(sent)
    assert all(s >= d for s, d in zip(ledger.column("sent_ms").to_pylist(),
                                      ledger.column("due_ms").to_pylist()))


def test_a_run_with_the_tasks_hold_still_sends_what_the_drivers_spool_holds(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir):
    """Switching `hold` back to "tasks" on a checkpoint whose spool still holds rows of a
    committed batch (a run with the driver's hold stopped before they were due): the next run
    sends them, so nothing is lost with the switch."""
    settings = job_settings(hold="driver")
    real = new_topic(**LOG_APPEND)
    checkpoint = work_dir / f"ckpt-switch-{uuid.uuid4().hex[:8]}"
    start_job(settings, checkpoint=str(checkpoint)).stop()
    committed = last_committed_batch(checkpoint)
    assert committed is not None
    now = int(time.time() * 1000)
    left = hold(checkpoint / SPOOL_FOLDER, kafka_bootstrap)
    left.put(committed, now, rows(real, [now, now + 1_000], tag="left"))
    left.stop()   # never started: what a stop before they were due leaves
    tasks = job_settings(hold="tasks", intake_topic=settings.intake_topic,
                         dlq_topic=settings.dlq_topic, data_dir=settings.data_dir)
    job = start_job(tasks, checkpoint=str(checkpoint))
    assert job._hold is not None
    records = consume_all(kafka_bootstrap, real, expected=2, timeout_s=60, idle_s=1)
    assert sorted(by_uniq(records)) == ["left-0", "left-1"]
    assert_eventually(lambda: not list((checkpoint / SPOOL_FOLDER).glob("*.arrow")),
                      timeout_s=20)


def test_the_lookup_finds_a_message_waiting_in_the_drivers_hold(spark, new_topic,
                                                                kafka_bootstrap, tmp_path):
    """`delayq ledger UNIQ_KEY` on a message fired ahead and not yet sent: pending, in the
    driver's hold, with its due time; once sent and its file gone, no longer there."""
    from streaming import lookup

    topic = new_topic(**LOG_APPEND)
    checkpoint = tmp_path / "ckpt"
    now = int(time.time() * 1000)
    waiting = hold(checkpoint / SPOOL_FOLDER, kafka_bootstrap)
    waiting.put(2, now, rows(topic, [now + 60_000], tag="ahead"))
    waiting.stop()   # never started: the row stays spooled
    where = lookup.find(spark, "ahead-0", tmp_path / "ledger", tmp_path / "dead", checkpoint)
    assert (where.status, where.detail["where"], where.detail["topic"]) == \
        ("pending", "the driver's hold", topic)
    # Sent by its batch's tasks, its ledger row not yet written: delivered.
    done = hold(checkpoint / SPOOL_FOLDER, kafka_bootstrap)
    done.put(3, now, None, sent=released_by_tasks(rows(topic, [now - 10], tag="done"), now))
    done.stop()
    where = lookup.find(spark, "done-0", tmp_path / "ledger", tmp_path / "dead", checkpoint)
    assert (where.status, where.detail["lateness_ms"], where.detail["batch_id"]) == \
        ("delivered", 10, 3)
    assert lookup.find(spark, "other", tmp_path / "ledger", tmp_path / "dead",
                       checkpoint).status == "unknown"


def test_a_row_kafka_does_not_take_is_sent_again_until_it_does(admin, kafka_bootstrap, tmp_path):
    """The error path: the producer gives up on a row (here its topic does not exist yet, and
    librdkafka's own wait is cut to 1 s); the hold sends it again, and once Kafka takes it,
    reports and deletes the file. Nothing lost, nothing early."""
    from streaming.admin import create_topic

    topic = f"later-{uuid.uuid4().hex[:8]}"
    now = int(time.time() * 1000)
    reports: list = []
    config = {**producer_config(kafka_bootstrap), "message.timeout.ms": 1000}
    h = DriverHold(tmp_path, config, on_sent=lambda *r: reports.append(r)).start(None)
    try:
        h.put(9, now, rows(topic, [now, now + 500]))
        assert_eventually(lambda: h.last_error is not None, timeout_s=20,
                          message="a failed delivery")
        assert not reports and h.pending() == 2, "not acknowledged: still held"
        create_topic(admin, topic, 1, {"message.timestamp.type": "LogAppendTime"})
        records = by_uniq(consume_all(kafka_bootstrap, topic, expected=2, timeout_s=60))
        assert sorted(records) == ["m-0", "m-1"]
        assert all(r.timestamp >= int(header_map(r)["DELIVER_MS"]) for r in records.values())
        assert_eventually(lambda: [r[0] for r in reports] == [9], timeout_s=20)
        assert_eventually(lambda: not list(tmp_path.glob("*.arrow")), timeout_s=10)
    finally:
        h.stop()
