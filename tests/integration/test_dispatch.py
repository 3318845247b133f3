"""The dispatch task (streaming/dispatch/task.py) on the real broker, without Spark: rows leave at their
due time and never before, by the broker's clock, from a host whose clock runs ahead of it or
behind it; a task
killed and started again sends again only what the ledger lacks, and a clean stop nothing; a
row its real topic refuses is dead-lettered with its reason and the partition goes on; the rows
a task holds are frozen out of Python's cyclic GC and nothing stays frozen after it."""
from __future__ import annotations

import gc
import itertools
import json
import multiprocessing
import threading
import time
import uuid
from dataclasses import dataclass, fields, replace

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaProducer

from conf import load_settings
from state import worker
from streaming.dispatch.rules import READY_STOP, DispatchConfig, Row
from streaming.ledger.records import SENDER, ledger_rows
from streaming.dispatch.task import run_partition
from state import headers as H
from streaming.stages import dispatch_config, rules_of
from tests.support import assert_eventually, consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


@dataclass(frozen=True)
class Rig(DispatchConfig):
    """A dispatch task's config, and the real topic its rows go to."""
    real: str = ""


@pytest.fixture
def dispatch(new_topic, kafka_bootstrap):
    """(config, write): a DispatchConfig over fresh intake, ready, ledger, real and dead-letter
    topics, and write(rows) leaving rows as the wheel does (`write_fired`), a wheel batch a call."""
    intake, ready, ledger = new_topic(**LOG_APPEND), new_topic(), new_topic(**LOG_APPEND)
    real, dlq = new_topic(**LOG_APPEND), new_topic(**LOG_APPEND)
    # The settings' dispatch configuration, on the fresh topics, reading no intake itself (it
    # reads the references' bodies back), at least once (test_exactly_once.py: transactions).
    settings = load_settings(delivery="at_least_once", intake_topic=intake, dlq_topic=dlq)
    config = replace(
        dispatch_config(settings, "run-1", 1_048_576, 1, {}, 1_048_588,
                        rules=rules_of(settings, "")),
        consumer={"bootstrap.servers": kafka_bootstrap, "group.id": f"dispatch-{uuid.uuid4().hex}"},
        producer={"bootstrap.servers": kafka_bootstrap, "linger.ms": 1, "acks": "all",
                  "enable.idempotence": True, "topic.metadata.propagation.max.ms": 2000,
                  "message.max.bytes": 1_048_576},
        ready_topic=ready, ledger_topic=ledger, dlq_topic=dlq,
        commit_interval_s=0.2, retry_backoff_s=0.2, direct_max_delay_ms=-1, ring=None)
    batches = itertools.count()

    def write(rows: list[dict]) -> None:
        write_fired(kafka_bootstrap, intake, ready, [{"topic": real, **row} for row in rows],
                    next(batches))

    return Rig(**{f.name: getattr(config, f.name) for f in fields(config)}, real=real), write


def write_fired(bootstrap: str, intake: str, ready: str, rows: list[dict], batch: int) -> None:
    """Each row's message on intake partition 0 (its own header "trace", REAL_TOPIC, REAL_QID if
    the row has a "qid", DELAY 1 or the row's "delay" header, and UNIQ_KEY), then its reference
    on ready partition 0 as
    sinks/ready.py writes it: keyed by the wheel batch `batch`, due at the row's "due"."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    landed: list = [None] * len(rows)
    for i, row in enumerate(rows):
        qid = [] if row.get("qid") is None else [(H.REAL_QID, str(row["qid"]).encode())]
        producer.produce(intake, key=row.get("key"), value=row.get("value", b"v"), partition=0,
                         headers=[("trace", b"t"), (H.REAL_TOPIC, row["topic"].encode()), *qid,
                                  row.get("delay", (H.DELAY, b"1")),
                                  (H.UNIQ_KEY, row["uniq"].encode())],
                         on_delivery=lambda err, msg, i=i: landed.__setitem__(i, (err, msg)))
    assert producer.flush(60) == 0, "the intake took every row"
    for row, (err, msg) in zip(rows, landed):
        assert err is None, f"{row['uniq']} not appended to the intake: {err}"
        # The intake's LogAppendTime, as the wheel read it: the reference's append_ms.
        producer.produce(ready, key=b"%d" % batch, partition=0, value=(
            f"{row['due']},1,0,{msg.offset()},{msg.timestamp()[1]},{row['uniq']}").encode())
    producer.flush(60)


def stop(config: DispatchConfig, bootstrap: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(config.ready_topic, value=config.run_id.encode(), partition=0,
                  headers=[(READY_STOP, b"1")])
    producer.flush()
    producer.close()


def in_thread(config: DispatchConfig, clock=time.time) -> tuple[threading.Thread, list]:
    result = []
    thread = threading.Thread(target=lambda: result.extend(run_partition(config, 0, clock)),
                              daemon=True)
    thread.start()
    return thread, result


def ledger_of(bootstrap: str, topic: str, expected: int, status: str | None = None
              ) -> list[dict]:
    """The ledger rows on `topic` (each record a batch of them; probes left out), once
    `expected` are there (of `status`, if given)."""
    flat = lambda records: [row for r in records if r.value
                            for row in ledger_rows(r.value).to_pylist()]
    counted = lambda rows: sum(status is None or row["status"] == status for row in rows)
    return flat(consume_all(bootstrap, topic, expected=10**9, timeout_s=60,
                            done=lambda records: counted(flat(records)) >= expected))


def _run(config: DispatchConfig) -> None:   # a task in a process of its own, to be killed
    list(run_partition(config, 0))


@pytest.mark.parametrize("host_s", [3.0, -3.0], ids=["host-ahead", "host-behind"])
def test_rows_leave_at_their_due_time_by_the_broker_s_clock_either_way(dispatch, kafka_bootstrap,
                                                                       new_topic, host_s):
    """The task's clock runs 3 s ahead of the broker's, or 3 s behind it: it measures the
    offset from its ledger topic's LogAppendTime acknowledgements and sends each row at its
    due time by the broker's clock: never early, and not the skew late. On a CreateTime topic
    a delivered record's timestamp is never before its DELIVER_MS."""
    config, write = dispatch
    created = new_topic(message_timestamp_type="CreateTime")
    now = int(time.time() * 1000)
    rows = [{"uniq": f"u{i}", "due": now + 1500 + 40 * i, "key": f"k{i % 3}".encode(),
             **({"topic": created} if i % 2 else {})} for i in range(60)]
    write(rows)
    thread, result = in_thread(config, clock=lambda: time.time() + host_s)
    records = consume_all(kafka_bootstrap, config.real, expected=30, timeout_s=60)
    stamped = consume_all(kafka_bootstrap, created, expected=30, timeout_s=60)
    stop(config, kafka_bootstrap)
    thread.join(60)
    due = {r["uniq"]: r["due"] for r in rows}
    late = [r.timestamp - due[header_map(r)["UNIQ_KEY"].decode()] for r in records]
    assert len(records) == 30 and min(late) >= 0, f"early by {-min(late)} ms"
    assert max(late) < 1500, f"late by {max(late)} ms"
    assert len(stamped) == 30
    for r in stamped:
        assert r.timestamp >= int(header_map(r)[H.DELIVER_MS]), "a timestamp before DELIVER_MS"
    first = records[0]
    assert [k for k, _ in first.headers] == ["trace", H.UNIQ_KEY, H.DELIVER_MS], \
        "restore headers removed, the message's own kept in order"
    for topic in (records, stamped):   # one key's rows to one topic leave in due order
        for key in (b"k0", b"k1", b"k2"):
            order = [due[header_map(r)["UNIQ_KEY"].decode()] for r in topic if r.key == key]
            assert order == sorted(order)
    assert result == [{"partition": 0, "sent": 60, "dead": 0, "skipped": 0}]
    reader = Consumer(config.consumer)
    [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
    reader.close()
    clock_ms = json.loads(got.metadata)["clock_ms"]   # the offset its commits report
    assert host_s * 1000 <= clock_ms < host_s * 1000 + 500


def test_a_task_freezes_the_rows_it_holds_and_leaves_nothing_frozen(dispatch, kafka_bootstrap,
                                                                    monkeypatch):
    """A task's rows held until due are frozen out of the collector's generations (state/worker.py,
    so its passes do not walk them again), still sent on time once due; when the task ends,
    nothing it held stays frozen."""
    config, write = dispatch
    now = int(time.time() * 1000)
    rows = [{"uniq": f"frozen{i}", "due": now + 4000} for i in range(20)]
    write(rows)
    seen, freeze = [], gc.freeze   # (this test's rows in the generations before, after) a freeze

    def counted() -> int:
        return sum(isinstance(o, Row) and o.uniq_key.startswith("frozen")
                   for o in gc.get_objects())

    def freezing() -> None:
        before = counted()
        freeze()
        seen.append((before, counted()))
    monkeypatch.setattr(worker.gc, "freeze", freezing)
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=20, timeout_s=60)
    stop(config, kafka_bootstrap)
    thread.join(60)
    late = [r.timestamp - (now + 4000) for r in records]
    assert len(records) == 20 and min(late) >= 0 and max(late) < 1500, late
    assert any(before >= 20 and after == 0 for before, after in seen), seen
    assert result == [{"partition": 0, "sent": 20, "dead": 0, "skipped": 0}]
    assert gc.get_freeze_count() == 0


# How late the other topic's rows may be while one topic is deleted. Measured: 0.1 s at least
# once; 3.2-3.4 s exactly once (an abort and the task's restart); a minute before the gone topic
# was looked for (the producer retried its records until the transaction's timeout).
KEPT_LATE_MS = 7000


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_real_topic_deleted_under_load_dead_letters_its_rows_and_the_partition_goes_on(
        dispatch, kafka_bootstrap, new_topic, admin, delivery):
    """Rows of 1 KB to two real topics, one of them deleted under load: 5,000 of its rows come
    due together 3 s after the deletion, while the other topic's 2,000 leave over 6 s. The
    thousands refused at once are dead-lettered, each with its reason and its message, their
    ledger rows in records below the ledger topic's limit; the other topic's rows keep leaving,
    none more than KEPT_LATE_MS late (read_committed: with exactly_once, an aborted
    transaction's copies are never seen); the task keeps running; every row is in the ledger
    once."""
    config, write = dispatch
    if delivery == "exactly_once":   # records to the gone topic looked up after 0.5 s
        config = replace(transactional(config), ack_check_s=0.5)
    doomed = new_topic(**LOG_APPEND)
    start = int(time.time() * 1000) + 15_000
    rows = [{"uniq": f"d{i}", "due": start - 4000 if i < 10 else start, "topic": doomed,
             "value": b"x" * 1024} for i in range(5_010)]
    rows += [{"uniq": f"k{i}", "due": start - 3000 + 3 * i, "value": b"x" * 1024}
             for i in range(2_000)]
    write(sorted(rows, key=lambda r: r["due"]))
    assert time.time() * 1000 < start - 6000, "the rows were written in time"
    thread, result = in_thread(config)
    consume_all(kafka_bootstrap, doomed, expected=10, timeout_s=60)   # the producer knows it
    time.sleep(max(0.0, start - 3000 - time.time() * 1000) / 1000)
    admin.delete_topics([doomed])
    kept = consume_all(kafka_bootstrap, config.real, expected=2_000, timeout_s=120)
    ledger = ledger_of(kafka_bootstrap, config.ledger_topic, 7_010)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert thread.is_alive() is False and result, "the task ended on its stop record"
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in kept) == \
        sorted(r["uniq"] for r in rows if "topic" not in r)
    due = {r["uniq"]: r["due"] for r in rows}
    late = max(r.timestamp - due[header_map(r)["UNIQ_KEY"].decode()] for r in kept)
    assert late <= KEPT_LATE_MS, f"the other topic's rows up to {late} ms late"
    statuses = {}
    for row in ledger:
        assert row["uniq_key"] not in statuses, f"{row['uniq_key']} twice in the ledger"
        statuses[row["uniq_key"]] = row["status"]
    assert set(statuses) == {r["uniq"] for r in rows}
    dead = {k for k, status in statuses.items() if status == "dead"}
    assert dead and all(k.startswith("d") for k in dead), "only the deleted topic's rows"
    letters = consume_all(kafka_bootstrap, config.dlq_topic, expected=len(dead), timeout_s=60)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in letters) == sorted(dead)
    assert all(r.value == b"x" * 1024 and header_map(r)["REAL_TOPIC"] == doomed.encode()
               for r in letters)
    assert len(dead) == 5_000, f"{len(dead)} refused: the topic went too late"
    assert result[0]["sent"] + result[0]["dead"] == 7_010 and result[0]["dead"] == len(dead)


def test_a_killed_task_sends_again_only_what_the_ledger_lacks_and_a_stop_nothing(
        dispatch, kafka_bootstrap):
    """The first rows are held (due in 12 s): the commit point stays below every row after them
    until they leave, so a task killed once the rest were delivered finds them all above its
    commit; the ledger says they are done and the new task skips them. Killed too before the
    held rows leave, its commits keep the first task's ledger mark (the ledger rows of what it
    skipped lie below its own start), and a third task skips them as well."""
    config, write = dispatch
    now = int(time.time() * 1000)
    held = [{"uniq": f"h{i}", "due": now + 12_000} for i in range(10)]
    prompt = [{"uniq": f"p{i}", "due": now} for i in range(300)]
    write(held + prompt)
    task = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    task.start()
    consume_all(kafka_bootstrap, config.real, expected=300, timeout_s=60)
    assert len(ledger_of(kafka_bootstrap, config.ledger_topic, 300)) == 300
    # Each ledger record names the process that sent its rows: this task's.
    ledger = consume_all(kafka_bootstrap, config.ledger_topic, expected=10**9, timeout_s=30,
                         done=lambda records: any(r.value for r in records))
    senders = {header_map(r)[SENDER].decode().split(":")[1] for r in ledger if r.value}
    assert senders == {str(task.pid)}
    time.sleep(1.0)            # its commits (every 0.2 s) go on: still below the held rows
    # Each commit says how many rows the task holds, by level (the pending gauge's part).
    first = _committed(config)
    assert first.offset == 0 and json.loads(first.metadata)["held"] == {"1": 10}
    task.kill()
    task.join(30)
    again = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    again.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:   # its own commit, holding the held rows again
        got = _committed(config)
        meta = json.loads(got.metadata)
        if meta["beat"] != json.loads(first.metadata)["beat"] and meta["held"] == {"1": 10}:
            break
        time.sleep(0.2)
    again.kill()
    again.join(30)
    assert got.offset == 0 and meta["ledger"] == json.loads(first.metadata)["ledger"]
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=310, timeout_s=60, idle_s=2)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert result and result[0]["skipped"] == 300 and result[0]["sent"] == 10
    keys = [header_map(r)["UNIQ_KEY"].decode() for r in records]
    assert sorted(keys) == sorted(r["uniq"] for r in held + prompt), "no duplicate, none lost"
    # A clean stop committed past everything: a new task has nothing to send.
    config = replace(config, run_id="run-2")
    thread, result = in_thread(config)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert result == [{"partition": 0, "sent": 0, "dead": 0, "skipped": 0}]


def _committed(config: DispatchConfig) -> TopicPartition:
    reader = Consumer(config.consumer)
    [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
    reader.close()
    return got


def transactional(config: DispatchConfig) -> DispatchConfig:
    """`config` delivering exactly once (streaming/dispatch/txn.py), a transaction every 0.2 s."""
    return replace(config, transactional_id=f"dispatch-{uuid.uuid4().hex}", commit_interval_s=0.2)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_rows_the_real_topic_refuses_are_dead_lettered_and_the_partition_goes_on(
        dispatch, kafka_bootstrap, new_topic, delivery):
    """With exactly_once, the refused record batch aborts the transaction: the task reads again
    from its last commit, sends each of that batch's rows alone, and the one too large itself
    aborts once more and is dead-lettered when read again; a missing topic and a REAL_QID beyond
    the partitions are found before the send. Either way each row arrives or is dead-lettered
    once (read_committed)."""
    config, write = dispatch
    if delivery == "exactly_once":
        config = transactional(config)
    small = new_topic(max_message_bytes="2000", **LOG_APPEND)
    now = int(time.time() * 1000)
    write([{"uniq": "missing", "due": now, "topic": "no-such-topic-delayq"},
           {"uniq": "beyond", "due": now, "qid": 7},
           # Sent together, the three share a record batch, which the broker refuses whole for
           # the large one: the two small ones are sent again alone and arrive.
           {"uniq": "small-before", "due": now, "topic": small, "key": b"k", "value": b"ok"},
           {"uniq": "large", "due": now, "topic": small, "key": b"k", "value": b"x" * 5000},
           {"uniq": "small-after", "due": now, "topic": small, "key": b"k", "value": b"ok"},
           *[{"uniq": f"ok{i}", "due": now} for i in range(5)]])
    thread, result = in_thread(config)
    delivered = consume_all(kafka_bootstrap, config.real, expected=5, timeout_s=60, idle_s=1)
    beside = consume_all(kafka_bootstrap, small, expected=2, timeout_s=60, idle_s=1)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in beside) == ["small-after",
                                                                           "small-before"]
    dead = consume_all(kafka_bootstrap, config.dlq_topic, expected=3, timeout_s=60, idle_s=1)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in delivered) == \
        [f"ok{i}" for i in range(5)]
    assert len(dead) == 3
    reasons = {header_map(r)["UNIQ_KEY"].decode(): header_map(r)["DLQ_REASON"].decode()
               for r in dead}
    assert reasons["missing"].startswith("unknown_topic: ") and "does not exist" in reasons["missing"]
    assert reasons["beyond"].startswith("partition_out_of_range: ") \
        and "out of range" in reasons["beyond"]
    assert reasons["large"].startswith("too_large: ") and "too large" in reasons["large"]
    assert all(header_map(r)["REAL_TOPIC"] for r in dead)
    ledger = ledger_of(kafka_bootstrap, config.ledger_topic, 10)
    assert len(ledger) == 10, "one ledger row each"
    statuses = {row["uniq_key"]: row["status"] for row in ledger}
    assert statuses == {"missing": "dead", "beyond": "dead", "large": "dead",
                        "small-before": "delivered", "small-after": "delivered",
                        **{f"ok{i}": "delivered" for i in range(5)}}
    assert result == [{"partition": 0, "sent": 7, "dead": 3, "skipped": 0}]


def test_a_dead_letter_the_broker_refuses_is_retried_until_taken_and_never_committed_past(
        dispatch, kafka_bootstrap, new_topic, admin):
    """The dead-letter topic refuses a dead letter (its max.message.bytes is below the
    record's size): the task goes on with the rows after it, keeps its commit point below it,
    and sends it again until the topic takes it, once, with its reason."""
    from kafka.admin import ConfigResource, ConfigResourceType

    config, write = dispatch
    config = replace(config, dlq_topic=new_topic(max_message_bytes="1000", **LOG_APPEND))
    now = int(time.time() * 1000)
    write([{"uniq": "refused", "due": now, "topic": "no-such-topic-delayq", "value": b"x" * 3000},
           *[{"uniq": f"ok{i}", "due": now} for i in range(5)]])
    thread, result = in_thread(config)
    assert len(consume_all(kafka_bootstrap, config.real, expected=5, timeout_s=60)) == 5
    time.sleep(2.0)           # several retries (every 0.2 s) and commits (every 0.2 s)
    assert consume_all(kafka_bootstrap, config.dlq_topic, expected=1, timeout_s=2) == []
    reader = Consumer(config.consumer)
    [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
    assert got.offset <= 0, "committed past a row whose dead letter was refused"
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, config.dlq_topic, configs={
        "max.message.bytes": "1048588", "message.timestamp.type": "LogAppendTime"})])
    dead = consume_all(kafka_bootstrap, config.dlq_topic, expected=1, timeout_s=60, idle_s=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # the commit moves past every row once it is taken
        [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
        if got.offset >= 6:
            break
        time.sleep(0.2)
    reader.close()
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert [header_map(r)["UNIQ_KEY"] for r in dead] == [b"refused"]
    assert header_map(dead[0])["DLQ_REASON"].decode().startswith("unknown_topic: ")
    assert got.offset >= 6
    statuses = {row["uniq_key"]: row["status"]
                for row in ledger_of(kafka_bootstrap, config.ledger_topic, 6)}
    assert statuses == {"refused": "dead", **{f"ok{i}": "delivered" for i in range(5)}}
    assert result == [{"partition": 0, "sent": 5, "dead": 1, "skipped": 0}]


def test_ledger_records_the_broker_refuses_are_each_sent_again_until_taken(
        dispatch, kafka_bootstrap, new_topic, admin):
    """The ledger topic refuses the task's ledger records (max.message.bytes below their size;
    its small probes pass): the messages are delivered, the commit point stays below them, and
    once the topic takes records again each refused record arrives, so every row is in the
    ledger once and the commit point moves past them all."""
    from kafka.admin import ConfigResource, ConfigResourceType

    config, write = dispatch
    # six rows: three ledger records sent together
    config = replace(config, ledger_topic=new_topic(max_message_bytes="400", **LOG_APPEND),
                     ledger_batch=2)
    now = int(time.time() * 1000)
    write([{"uniq": f"r{i}", "due": now} for i in range(6)])
    thread, result = in_thread(config)
    assert len(consume_all(kafka_bootstrap, config.real, expected=6, timeout_s=60)) == 6
    time.sleep(2.0)           # several retries and commits (every 0.2 s)
    reader = Consumer(config.consumer)
    [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
    assert got.offset <= 0, "committed past rows the ledger does not have"
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, config.ledger_topic, configs={
        "max.message.bytes": "1048588", "message.timestamp.type": "LogAppendTime"})])
    rows = ledger_of(kafka_bootstrap, config.ledger_topic, 6)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and got.offset < 6:
        time.sleep(0.2)
        [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
    reader.close()
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert sorted(row["uniq_key"] for row in rows) == [f"r{i}" for i in range(6)]
    assert got.offset >= 6
    assert result == [{"partition": 0, "sent": 6, "dead": 0, "skipped": 0}]


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_a_wheel_batch_fired_again_after_a_crash_is_sent_once(
        dispatch, kafka_bootstrap, new_topic, delivery):
    """The wheel's batch 7 fired references: half due at once, half in 6 s. The task sends the
    first half, commits past them and is killed; the wheel, restarted, fires batch 7 again (Spark's
    Kafka sink is at least once), then batch 8. The new task sends each message once: it skips
    the copies of what it sent before its commit (below the commit point, known from the
    commit's naming of batch 7, not from the ledger) and of what it still held; and sends all of
    batch 8, which holds messages of batch 7's UNIQ_KEYs due at another time."""

    config, _ = dispatch
    if delivery == "exactly_once":
        config = transactional(config)
    real, intake = config.real, new_topic(**LOG_APPEND)
    config = replace(config, intake_topic=intake, rules=rules_of(
        load_settings(intake_topic=intake, dlq_topic=config.dlq_topic), ""))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    appended = [producer.send(intake, value=b"v%d" % i, headers=[
        ("REAL_TOPIC", real.encode()), ("DELAY", b"1"), ("UNIQ_KEY", f"m{i % 20}".encode())]
    ).get(timeout=30) for i in range(30)]
    now = int(time.time() * 1000)
    due = [now] * 10 + [now + 6000] * 10 + [now + 1] * 10   # the last ten: batch 8's
    ready = Producer({"bootstrap.servers": kafka_bootstrap})

    def fire(batch: int, messages: range) -> None:   # as sinks/ready.py writes a batch
        for i in messages:
            ready.produce(config.ready_topic, partition=0, key=b"%d" % batch, value=(
                f"{due[i]},1,0,{appended[i].offset},{appended[i].timestamp},m{i % 20}").encode())
        ready.flush(30)

    fire(7, range(10))
    task = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    task.start()
    assert len(consume_all(kafka_bootstrap, real, expected=10, timeout_s=60)) == 10
    ledger_of(kafka_bootstrap, config.ledger_topic, 10)
    # The rest of the batch comes once those are in the ledger: the commit's ledger mark lies
    # past their ledger rows, so only the commit's naming of batch 7 tells their copies apart.
    fire(7, range(10, 20))
    reader = Consumer(config.consumer)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # its commit point moves to the held half
        [got] = reader.committed([TopicPartition(config.ready_topic, 0)], timeout=10)
        if got.offset == 10:
            break
        time.sleep(0.2)
    reader.close()
    assert got.offset == 10 and json.loads(got.metadata)["batch"] == [7, 0]
    task.kill()
    task.join(30)
    fire(7, range(20))                      # batch 7 again, after the crash
    fire(8, range(20, 30))
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, real, expected=30, timeout_s=60, idle_s=3)
    stop(config, kafka_bootstrap)
    thread.join(60)
    got = sorted((header_map(r)["UNIQ_KEY"].decode(), int(header_map(r)["DELIVER_MS"]))
                 for r in records)
    assert got == sorted((f"m{i % 20}", due[i]) for i in range(30)), "each message once"
    assert all(r.timestamp >= int(header_map(r)["DELIVER_MS"]) for r in records)
    assert result and result[0]["skipped"] == 20 and result[0]["sent"] == 20


def test_short_levels_read_from_the_intake_leave_on_time_once_across_a_kill(
        dispatch, new_topic, kafka_bootstrap):
    """The task also reads the intake (streaming/dispatch/direct.py): immediate and 1 s messages leave at
    their due time (the intake's append time plus the level's delay), never before; 10 s
    messages and bad input are the wheel's and are left alone. Killed while it holds 5 s
    messages, a new task sends each message the ledger lacks, and only those."""
    from state.envelope import Rules

    config, _ = dispatch
    intake = new_topic(partitions=2, **LOG_APPEND)
    config = replace(config, intake_topic=intake, direct_max_delay_ms=5000, rules=Rules(
        (1000, 5000, 10000), intake, config.dlq_topic, allowed_topics=frozenset(),
        max_delay_ms=86_400_000, clock_tolerance_ms=60_000, near_horizon_ms=600_000,
        cold_bucket_ms=3_600_000, timer_parts=8, ring_horizon_ms=0,
        rolls_to_ring=False, seal_key="", legacy_before=()))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")

    def send(level: bytes, n: int, tag: str, delay_header: str = H.DELAY) -> None:
        for i in range(n):
            producer.send(intake, key=f"k{i % 4}".encode(), value=f"{tag}{i}".encode(),
                          partition=i % 2, headers=[(H.REAL_TOPIC, config.real.encode()),
                                                    (delay_header, level),
                                                    (H.UNIQ_KEY, f"{tag}{i}".encode())])
        producer.flush()

    send(b"2", 30, "held")                     # 5 s: held when the task is killed
    send(b"0", 40, "now")
    send(b"1", 40, "one")
    send(b"3", 20, "wheel")                    # 10 s: the wheel's
    send(b"x", 5, "bad")                       # dead: the wheel's
    task = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    task.start()
    consume_all(kafka_bootstrap, config.real, expected=80, timeout_s=60)
    ledger_of(kafka_bootstrap, config.ledger_topic, 80)
    task.kill()
    task.join(30)
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=110, timeout_s=60, idle_s=3)
    stop(config, kafka_bootstrap)
    thread.join(60)
    appended = {r.value.decode(): r.timestamp
                for r in consume_all(kafka_bootstrap, intake, expected=135, timeout_s=30)}
    delay = {"now": 0, "one": 1000, "held": 5000}
    keys = sorted(header_map(r)["UNIQ_KEY"].decode() for r in records)
    assert keys == sorted(f"{tag}{i}" for tag, n in (("held", 30), ("now", 40), ("one", 40))
                          for i in range(n)), "each direct message once; none of the wheel's"
    for r in records:
        name = r.value.decode()
        due = appended[name] + delay[name.rstrip("0123456789")]
        assert int(header_map(r)[H.DELIVER_MS]) == due
        assert r.timestamp >= due, f"{name} early by {due - r.timestamp} ms"
    # The commit point stayed below the held rows: the 80 sent before the kill were read
    # again and skipped, as the ledger holds them.
    assert result and result[0]["sent"] == 30 and result[0]["skipped"] == 80
    # One key of one intake partition leaves in intake order.
    order = [int(r.value.decode()[3:]) for r in records
             if r.value.startswith(b"one") and r.key == b"k1"]
    assert order == sorted(order)
    # Its commits on the intake: past every record the task read.
    reader = Consumer(config.consumer)
    got = reader.committed([TopicPartition(intake, 0), TopicPartition(intake, 1)], timeout=10)
    ends = [reader.get_watermark_offsets(TopicPartition(intake, p), timeout=10)[1]
            for p in (0, 1)]
    reader.close()
    assert [tp.offset for tp in got] == ends
    producer.close()


def test_a_partition_added_to_the_intake_under_load_is_read_from_its_beginning(
        dispatch, new_topic, kafka_bootstrap, admin):
    """The task looks for new intake partitions (every `intake_refresh_s`) while it reads a
    steady load on the first one: the short-level messages of a partition added meanwhile,
    which the wheel leaves out, are sent, and every message of either partition once."""
    from kafka.admin import NewPartitions

    from state.envelope import Rules

    config, _ = dispatch
    intake = new_topic(partitions=1, **LOG_APPEND)
    # gather_s: records read wait longer before they are taken
    config = replace(config, intake_topic=intake, direct_max_delay_ms=1000, intake_refresh_s=1.0,
                     gather_s=0.3, rules=Rules(
                         (1000, 5000), intake, config.dlq_topic, allowed_topics=frozenset(),
                         max_delay_ms=86_400_000, clock_tolerance_ms=60_000,
                         near_horizon_ms=600_000, cold_bucket_ms=3_600_000, timer_parts=8,
                         ring_horizon_ms=0, rolls_to_ring=False, seal_key="", legacy_before=()))
    sent = []

    def send(producer, partition: int, n: int, pause_s: float) -> None:
        for _ in range(n):
            name = f"p{partition}-{len(sent)}"
            sent.append(name)
            producer.send(intake, value=name.encode(), partition=partition,
                          headers=[(H.REAL_TOPIC, config.real.encode()),
                                   (H.DELAY, str(len(sent) % 2).encode())])
            time.sleep(pause_s)

    thread, result = in_thread(config)
    before = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    send(before, 0, 300, 0.005)
    admin.create_partitions({intake: NewPartitions(total_count=2)})
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    for _ in range(4):   # the load goes on over the task's refreshes, on both partitions
        send(before, 0, 300, 0.003)
        send(producer, 1, 20, 0.0)
    for client in (before, producer):
        client.flush()
        client.close()
    records = consume_all(kafka_bootstrap, config.real, expected=len(sent), timeout_s=60,
                          idle_s=2)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert result, "the task ended on its stop record"
    names = [r.value.decode() for r in records]
    twice = {n for n in names if names.count(n) > 1}
    assert not twice, f"{len(twice)} sent twice, e.g. {sorted(twice)[:3]}"
    assert sorted(names) == sorted(sent)
    assert result[0]["sent"] == len(sent)


def test_references_are_read_back_from_the_intake_and_a_record_gone_or_replaced_is_dead_lettered(
        dispatch, kafka_bootstrap, new_topic):
    """The wheel fires references, and the task reads each one's record back from the intake,
    in runs and across gaps, and sends it whole (its key, value and own headers, then UNIQ_KEY
    and DELIVER_MS) at its due time, never early. A record the intake's retention deleted, an
    offset past the partition's end, a partition the intake does not have (recreated with fewer)
    and a record that is not the one referenced (another UNIQ_KEY, another append time) are
    dead-lettered with their reason, and the rest still go."""
    from confluent_kafka.admin import AdminClient

    config, _ = dispatch
    real, intake = config.real, new_topic(**LOG_APPEND)
    settings = load_settings(intake_topic=intake, dlq_topic=config.dlq_topic)
    config = replace(config, intake_topic=intake, rules=rules_of(settings, ""), fetch_gap=5)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    records = []
    for i in range(300):
        meta = producer.send(intake, key=f"k{i}".encode(), value=b"v%d" % i, headers=[
            ("REAL_TOPIC", real.encode()), ("DELAY", b"1"), ("u", b"%d" % i),
            ("UNIQ_KEY", f"m{i}".encode())]).get(timeout=30)
        records.append((meta.offset, meta.timestamp))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})   # kept: it runs the request
    for done in admin.delete_records([TopicPartition(intake, 0, 10)]).values():
        done.result(30)
    due = int(time.time() * 1000) + 3_000
    wanted = [i for i in range(300) if i % 7 == 0 or 100 <= i < 160]   # runs and gaps
    refs = [(f"m{i}", *records[i]) for i in wanted]
    refs[wanted.index(105)] = ("m-other", *records[105])          # another UNIQ_KEY there
    refs[wanted.index(112)] = ("m112", records[112][0], records[112][1] + 1)   # appended else
    refs.append(("m-far", 10_000, records[0][1]))                   # past the end
    refs = [(uniq, 0, offset, append) for uniq, offset, append in refs]
    refs.append(("m-nowhere", 3, 0, records[0][1]))   # a partition the intake does not have
    ready = Producer({"bootstrap.servers": kafka_bootstrap})   # as the wheel writes them: no body
    for uniq, part, offset, append in refs:
        ready.produce(config.ready_topic, partition=0, key=b"0",   # one wheel batch
                      value=f"{due},1,{part},{offset},{append},{uniq}".encode())
    ready.flush(30)

    thread, result = in_thread(config)
    good = [i for i in wanted if i >= 10 and i not in (105, 112)]
    delivered = consume_all(kafka_bootstrap, real, expected=len(good), timeout_s=60)
    dead = consume_all(kafka_bootstrap, config.dlq_topic, expected=len(refs) - len(good),
                       timeout_s=60)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert sorted(int(r.value[1:]) for r in delivered) == good
    for r in delivered:
        i = int(r.value[1:])
        assert r.key == f"k{i}".encode() and r.timestamp >= due
        assert list(r.headers) == [("u", b"%d" % i), (H.UNIQ_KEY, f"m{i}".encode()),
                                   (H.DELIVER_MS, str(due).encode())]
    reasons = {header_map(r)[H.UNIQ_KEY].decode(): header_map(r)[H.DLQ_REASON].decode()
               for r in dead}
    assert sorted(reasons) == sorted(["m0", "m7", "m-other", "m112", "m-far", "m-nowhere"])
    assert all(reasons[k].startswith("intake_record_gone: ")
               for k in ("m0", "m7", "m-far", "m-nowhere"))
    assert "deleted (the intake's retention)" in reasons["m0"]
    assert "is in no partition" in reasons["m-nowhere"]
    assert all(reasons[k].startswith("intake_record_replaced: ") for k in ("m-other", "m112"))
    assert header_map(dead[0])["DELAYQ_INTAKE_RECORD"]
    assert result and result[0]["dead"] == 6


def test_a_reference_waiting_for_its_body_holds_back_only_its_own_intake_partition(
        dispatch, kafka_bootstrap, new_topic):
    """A reference past its intake partition's end waits END_WAIT_S (10 s) for its record,
    then is dead-lettered: the rows of that partition due after it wait with it (one key's
    order), those of the other partition leave on time."""
    config, _ = dispatch
    real, intake = config.real, new_topic(partitions=2, **LOG_APPEND)
    settings = load_settings(intake_topic=intake, dlq_topic=config.dlq_topic)
    config = replace(config, intake_topic=intake, rules=rules_of(settings, ""))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    records = {}
    for part, i in itertools.product((0, 1), range(10)):
        uniq = f"p{part}-{i}"
        meta = producer.send(intake, value=uniq.encode(), partition=part, headers=[
            ("REAL_TOPIC", real.encode()), ("DELAY", b"1"), ("UNIQ_KEY", uniq.encode())]
        ).get(timeout=30)
        records[uniq] = part, meta.offset, meta.timestamp
    producer.close()
    due = int(time.time() * 1000) + 3_000
    # Just past partition 0's end (further, the read-back seeks there and finds it out of
    # range at once): it waits for the end to move.
    refs = [("far", 0, records["p0-9"][1] + 1, records["p0-0"][2], due)]
    refs += [(uniq, *where, due + 100 + 50 * i) for i, (uniq, where) in enumerate(records.items())]
    ready = Producer({"bootstrap.servers": kafka_bootstrap})   # as the wheel writes them
    for uniq, part, offset, append, at in refs:
        ready.produce(config.ready_topic, partition=0, key=b"0",
                      value=f"{at},1,{part},{offset},{append},{uniq}".encode())
    ready.flush(30)
    thread, result = in_thread(config)
    delivered = consume_all(kafka_bootstrap, real, expected=20, timeout_s=60)
    dead = consume_all(kafka_bootstrap, config.dlq_topic, expected=1, timeout_s=60)
    stop(config, kafka_bootstrap)
    thread.join(60)
    at = {uniq: when for uniq, *_, when in refs}
    late = {r.value.decode(): r.timestamp - at[r.value.decode()] for r in delivered}
    assert sorted(late) == sorted(records) and min(late.values()) >= 0
    assert max(late[f"p1-{i}"] for i in range(10)) < 1500, "held back by partition 0's wait"
    assert min(late[f"p0-{i}"] for i in range(10)) > 5000, "sent before the reference before it"
    assert [header_map(r)[H.UNIQ_KEY] for r in dead] == [b"far"]
    order = [r.value.decode() for r in delivered if r.value.startswith(b"p0")]
    assert order == [f"p0-{i}" for i in range(10)], "partition 0's rows in due order"


def test_a_cancel_drops_its_target_that_comes_later_also_across_a_kill(
        dispatch, new_topic, kafka_bootstrap):
    """A cancel due within the window reaches the task before its target: the task keeps it
    as a tombstone, holds its commit point below it, and when killed, its successor reads the
    cancel again and drops the target that comes only now (a fired reference), with a ledger
    row `cancelled`; its neighbour leaves on time. A cancel whose target never comes is a miss,
    with a ledger row of its own once the target's due time and the window have passed."""
    from streaming.dispatch.cancels import CANCELLED, MISSED

    config, write = dispatch
    config = transactional(replace(config, direct_max_delay_ms=8_000, rules=rules_of(
        load_settings(intake_topic=config.intake_topic, dlq_topic=config.dlq_topic), "")))
    intake = config.intake_topic
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    due = int(time.time() * 1000) + 7_000
    cancels = [producer.send(intake, b"", partition=0, headers=[
        (H.TIMER_DEL_UNIQKEY, key), (H.TIMER_DELIVER_MS, str(due).encode())]).get(30)
        for key in (b"target", b"never")]
    # A direct message after the cancels: it leaves and is done, the commit stays below them.
    producer.send(intake, b"soon", partition=0, headers=[
        (H.REAL_TOPIC, config.real.encode()), (H.DELAY, b"1"), (H.UNIQ_KEY, b"soon")]).get(30)
    task = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    task.start()
    consume_all(kafka_bootstrap, config.real, expected=1, timeout_s=60)
    ledger_of(kafka_bootstrap, config.ledger_topic, 1)
    reader = Consumer(config.consumer)
    assert_eventually(lambda: reader.committed([TopicPartition(intake, 0)], timeout=10)[0].offset
                      == cancels[0].offset, timeout_s=30, message="the commit held at the cancel")
    reader.close()
    task.kill()
    task.join(30)
    # The target comes only now, through the wheel (its intake record is a timer beyond the
    # window, the wheel's), and its neighbour with it; then the wheel's notices of the two
    # cancels, as it writes them once it read them (sinks/ready.py): it found neither target.
    write([{"uniq": uniq, "due": due, "delay": (H.TIMER_DELAY_MS, b"60000")}
           for uniq in ("target", "neighbour")])
    notices = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, meta in zip(("target", "never"), cancels):
        notices.produce(config.ready_topic, key=b"99", partition=0,
                        value=f"{due},-1,0,{meta.offset},{meta.timestamp},{key}".encode(),
                        headers=[(H.READY_CANCEL, H.OPEN)])
    notices.flush(30)
    thread, result = in_thread(config)
    records = consume_all(kafka_bootstrap, config.real, expected=2, timeout_s=60, idle_s=2)
    rows = ledger_of(kafka_bootstrap, config.ledger_topic, 4)   # soon, target, neighbour, never
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert sorted(header_map(r)["UNIQ_KEY"].decode() for r in records) == ["neighbour", "soon"]
    assert all(r.timestamp >= int(header_map(r)[H.DELIVER_MS]) for r in records)
    neighbour = next(r for r in records if r.value == b"v")
    assert neighbour.timestamp - due < 1_500, "the neighbour on time"
    status = {(r["uniq_key"], r["status"]) for r in rows}
    assert {("target", CANCELLED), ("never", MISSED), ("neighbour", "delivered"),
            ("soon", "delivered")} == status
    assert next(r for r in rows if r["uniq_key"] == "never")["sent_ms"] >= due + 8_000
    producer.close()
