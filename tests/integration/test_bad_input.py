"""Bad input, drawn by hypothesis, through the real job: every record a producer can write
(any contract header with good or bad values, random names, bytes and encodings, random
keys and values, any producer timestamp) is either delivered on time or dead-lettered with
its reason, and the stream keeps flowing. The expected outcome of each record comes from the
pure header rules (`state.envelope.parse`) at the broker's append time, plus what only the
cluster knows (topic exists, partition in range, record small enough)."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from state import headers as H
from state.envelope import Kind, parse
from streaming.stages import rules_of
from tests.support import consume_all, header_map

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}
SMALL_LIMIT = 2048  # max.message.bytes of the "big" topic: records of 3 KiB are too large


def record_strategy(real: str, small: str, intake: str, dlq: str):
    topics = st.one_of(
        st.sampled_from([real, real, small, intake, dlq, "__consumer_offsets", "no-such-topic",
                         "bad topic!", ""]).map(str.encode),
        st.binary(max_size=12))
    numbers = st.one_of(st.integers(-3, 5), st.integers(-5000, 5000)).map(lambda n: str(n).encode())
    junk = st.one_of(st.sampled_from([b"", b"abc", b"\xff\xfe", b" 2 ", b"1.5", b"0x1"]),
                     st.binary(max_size=8))
    header = st.one_of(
        st.tuples(st.just(H.REAL_TOPIC), topics),
        st.tuples(st.just(H.REAL_QID), st.one_of(st.sampled_from([b"0", b"1", b"7"]), junk)),
        st.tuples(st.sampled_from([H.DELAY, H.TIMER_DELAY_MS]), st.one_of(numbers, junk)),
        st.tuples(st.just(H.TIMER_DELAY_SEC), st.one_of(st.integers(-2, 4).map(lambda n: str(n).encode()), junk)),
        # An absolute time near now: filled in at send time from the offset drawn here.
        st.tuples(st.just(H.TIMER_DELIVER_MS), st.integers(-90_000, 4_000).map(lambda n: ("now", n))),
        st.tuples(st.just(H.DELIVER_MS), numbers),
        st.tuples(st.text(max_size=8).filter(lambda n: n not in H.CONTROL_HEADERS), junk),
    )
    return st.lists(st.fixed_dictionaries({
        "headers": st.lists(header, max_size=5),
        "key": st.one_of(st.none(), st.binary(max_size=16)),
        "body": st.one_of(st.binary(max_size=64), st.just(b"x" * 3072)),  # 3 KiB: too large for `small`
        # Any producer timestamp, up to years ahead: LogAppendTime makes the broker ignore it.
        "timestamp_ms": st.one_of(st.none(), st.integers(0, 2**42)),
    }), min_size=15, max_size=30)


@pytest.fixture
def bad_input_stack(job_settings, start_job, new_topic):
    settings = job_settings()
    real = new_topic(partitions=2, **LOG_APPEND)
    small = new_topic(max_message_bytes=str(SMALL_LIMIT), **LOG_APPEND)
    start_job(settings)
    return settings, real, small


def expected_outcome(record, meta, settings, real, small):
    """('deliver', due_ms) or ('dead', reason or reason fragment) for one sent record."""
    envelope = parse(record["sent_headers"], meta.partition, meta.offset, meta.timestamp,
                     rules_of(settings, ""), now_ms=meta.timestamp)
    if envelope.kind == Kind.DEAD:
        return "dead", envelope.reason
    assert envelope.kind in (Kind.NOW, Kind.DELAY), envelope
    partitions = {real: 2, small: 1}.get(envelope.real_topic)
    if partitions is None:
        return "dead", "does not exist"
    if envelope.real_qid is not None and envelope.real_qid >= partitions:
        return "dead", "out of range"
    if envelope.real_topic == small and len(record["body"]) > SMALL_LIMIT:
        return "dead", "too large"
    return "deliver", envelope.due_ms


@settings(max_examples=3, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_input_is_delivered_on_time_or_dead_lettered_with_its_reason(data, bad_input_stack,
                                                                          kafka_bootstrap):
    settings, real, small = bad_input_stack
    records = data.draw(record_strategy(real, small, settings.intake_topic, settings.dlq_topic))
    # Always among them: one too large for its topic between two good ones for the same topic.
    records += [{"headers": [(H.REAL_TOPIC, small.encode()), (H.DELAY, level)], "key": b"k",
                 "body": body, "timestamp_ms": None}
                for level, body in ((b"1", b"ok"), (b"1", b"x" * 3072), (b"2", b"ok"))]
    # Always among them too: bad records of a short level, which a dispatch task reads from
    # the intake itself and dead-letters (streaming/dispatch/direct.py), not the wheel.
    records += [{"headers": headers, "key": None, "body": b"short", "timestamp_ms": None}
                for headers in ([(H.DELAY, b"1")], [(H.REAL_TOPIC, real.encode()), (H.DELAY, b"1"),
                                                    (H.REAL_QID, b"x")])]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8192)
    tag = f"{time.time_ns()}"
    futures = []
    for i, record in enumerate(records):
        now = int(time.time() * 1000)
        record["sent_headers"] = [
            (name, str(now + value[1]).encode() if isinstance(value, tuple) else value)
            for name, value in record["headers"]]
        # A unique prefix finds each record again, wherever it ends up.
        record["value"] = f"{tag}-{i}|".encode() + record["body"]
        futures.append(producer.send(settings.intake_topic, record["value"], key=record["key"],
                                     headers=record["sent_headers"],
                                     timestamp_ms=record["timestamp_ms"]))
    producer.flush()
    metas = [f.get(timeout=30) for f in futures]
    producer.close()
    expected = {r["value"]: expected_outcome(r, m, settings, real, small)
                for r, m in zip(records, metas)}
    want_dead = {v for v, (kind, _) in expected.items() if kind == "dead"}
    want_sent = {v for v, (kind, _) in expected.items() if kind == "deliver"}

    def mine(got):
        return [r for r in got if r.value.startswith(f"{tag}-".encode())]
    dead = mine(consume_all(kafka_bootstrap, settings.dlq_topic, expected=0, timeout_s=60,
                            idle_s=1, done=lambda got: {r.value for r in mine(got)} >= want_dead))
    def delivered_now(idle_s: float = 0.2):
        return mine(consume_all(kafka_bootstrap, real, expected=0, idle_s=idle_s)
                    + consume_all(kafka_bootstrap, small, expected=0, idle_s=idle_s))
    deadline = time.monotonic() + 60
    delivered = delivered_now()
    while {r.value for r in delivered} < want_sent and time.monotonic() < deadline:
        delivered = delivered_now()
    time.sleep(2)  # a duplicate would show up now
    delivered = delivered_now(1.5)

    assert sorted(r.value for r in dead) == sorted(want_dead), "each bad record, once, on the DLQ"
    for record in dead:
        reason = header_map(record)[H.DLQ_REASON].decode()
        assert expected[record.value][1] in reason, (record.value[:40], reason)
    assert sorted(r.value for r in delivered) == sorted(want_sent), "each good record, once"
    for record in delivered:
        due = expected[record.value][1]
        assert int(header_map(record)[H.DELIVER_MS]) == due
        assert record.timestamp >= due, f"{due - record.timestamp} ms early"


# Header values for the split's two copies: integers at the edges of a long and of the window,
# and what `parse` refuses (spaces, "+", non-ASCII digits, not UTF-8, empty, none).
SPLIT_VALUES = st.one_of(
    st.sampled_from([b"0", b"1", b"2", b"3", b"4", b"9", b"02", b"-0", b" 1", b"1 ", b"+1", b"",
                     b"1\n", None, b"\xff", "１".encode(), "٣".encode(), b"9223372036854775807",
                     b"9223372036854775808", b"-9223372036854775808", b"-9223372036854775809",
                     b"9223372036854775", b"10000", b"10001", b"-60000"]),
    st.integers(-2**64, 2**64).map(lambda n: str(n).encode()),
    st.integers(-100_000, 20_000).map(lambda n: ("at", n)))   # TIMER_DELIVER_MS near append
SPLIT_NAMES = st.sampled_from([*H.DELAY_HEADERS, *H.DELAY_HEADERS, H.TIMER_DEL_UNIQKEY,
                               H.HEARTBEAT, H.ROLLED, H.REAL_TOPIC, "delay", "trace"])


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(st.tuples(st.lists(st.tuples(SPLIT_NAMES, SPLIT_VALUES), max_size=4),
                                  st.integers(0, 3), st.integers(0, 40),
                                  st.integers(0, 2**42)), min_size=300, max_size=400),
       legacy=st.sampled_from([(), (20, 0, 40)]))
def test_the_wheel_leaves_out_exactly_the_records_the_dispatch_takes(records, legacy, spark,
                                                                     job_settings):
    """The split of the intake between the wheel and the dispatch tasks, on the same drawn
    records, below and above the offsets of an older delayq's split: what the wheel reads (the
    JVM's filter, streaming/wheel/query.py `surely_direct`, then its parse, state/parse.py) is
    exactly what a dispatch task leaves (state/split.py `is_direct`), and every cancel. Every
    record has one owner; a cancel the task takes, the wheel reads too."""
    import pyarrow as pa
    from dataclasses import replace

    from state.columns import HEADERS
    from state.envelope import Kind
    from state.parse import parse_batch
    from state.split import is_direct
    from streaming.wheel.query import surely_direct

    settings = job_settings(delay_levels="1s 5s 10s 30s", dispatch_direct_max_delay_ms=10_000,
                            ring_slots=12, ring_slot_ms=2_000)   # timers to 20 s: the ring's
    # Offsets made unique (a record is known by its position), each on its side of `legacy`.
    rules = replace(rules_of(settings, ""), legacy_before=tuple(o * 1000 for o in legacy))
    cases = [([(k, str(append + v[1]).encode() if isinstance(v, tuple) else v) for k, v in headers],
              part, off * 1000 + i, append) for i, (headers, part, off, append) in enumerate(records)]
    cases += [([(H.DELAY, b"2")], 0, 50_998, 1), ([(H.DELAY, b"4")], 0, 50_999, 1)]   # one each
    window = settings.dispatch_direct_max_delay_ms
    frame = spark.createDataFrame(
        [(i, part, off, append, headers or None) for i, (headers, part, off, append)
         in enumerate(cases)],
        "i int, ipart int, ioff long, append_ms long, "
        "headers array<struct<key:string,value:binary>>")
    jvm = {r["i"]: r["surely"] for r in
           frame.select("i", surely_direct(rules, window).alias("surely")).collect()}
    dispatch = [is_direct(h, append, part, off, rules, window) for h, part, off, append in cases]
    assert not [cases[i] for i, surely in jvm.items() if surely and not dispatch[i]], \
        "the JVM drops only what the dispatch takes"
    rest = [i for i in range(len(cases)) if not jvm[i]]
    batch = pa.record_batch({
        "ipart": pa.array([cases[i][1] for i in rest], pa.int32()),
        "ioff": pa.array([cases[i][2] for i in rest], pa.int64()),
        "append_ms": pa.array([cases[i][3] for i in rest], pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in cases[i][0]] for i in rest],
                            HEADERS),
        "i": pa.array(rest, pa.int64())})
    kinds = parse_batch(batch, rules, 1_000, 2, 10**12).column("kind").to_pylist()
    read = parse_batch(batch, rules, 1_000, 2, 10**12, window_ms=window)
    wheel = {(p, o) for p, o in zip(read.column("ipart").to_pylist(),
                                    read.column("ioff").to_pylist())}
    for i, kind in zip(rest, kinds):
        want = not dispatch[i] or kind == Kind.CANCEL.value
        assert ((cases[i][1], cases[i][2]) in wheel) == want, cases[i]
    assert 0 < sum(dispatch) < len(cases) and any(jvm.values())


def test_intake_writes_of_an_aborted_transaction_are_never_delivered_or_dead_lettered(
        bad_input_stack, kafka_bootstrap):
    """A producer writes to the intake in Kafka transactions: what an aborted one wrote (every
    path: immediate, a short level, the wheel's levels, a timer, bad input) is neither delivered
    nor dead-lettered; what committed ones and plain writes around it wrote is."""
    from confluent_kafka import Producer

    settings, real, _ = bad_input_stack
    plain_producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"intake-writer-{time.time_ns()}"})
    producer.init_transactions(30)
    kinds = [[(H.REAL_TOPIC, real.encode()), (H.DELAY, level)] for level in (b"0", b"1", b"2", b"3")]
    kinds += [[(H.REAL_TOPIC, real.encode()), (H.TIMER_DELAY_MS, b"1500")], [(H.DELAY, b"1")]]

    def write(client, tag: str) -> list[bytes]:
        values = []
        for i, headers in enumerate(kinds):
            values.append(f"{tag}-{i}".encode())
            client.produce(settings.intake_topic, values[-1], partition=i % 3, headers=headers)
        client.flush(30)
        return values

    plain = write(plain_producer, "plain-before")
    producer.begin_transaction()
    aborted = write(producer, "aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed = write(producer, "committed")
    producer.commit_transaction(30)
    plain += write(plain_producer, "plain-after")
    wanted = sorted(v for v in plain + committed if not v.endswith(b"-5"))   # -5: bad input
    records = consume_all(kafka_bootstrap, real, expected=len(wanted), timeout_s=90, idle_s=3)
    assert sorted(r.value for r in records) == wanted
    dead = consume_all(kafka_bootstrap, settings.dlq_topic, expected=3, timeout_s=60, idle_s=3)
    assert sorted(r.value for r in dead) == sorted(v for v in plain + committed
                                                   if v.endswith(b"-5"))
    assert not {r.value for r in records + dead} & set(aborted)


# Records at the edges of the parse's rules, among them the one that stopped the job for good
# (DELAYQ_ROLLED=2147483648): each is dead-lettered with the reason `parse` gives it.
EDGE_RECORDS = [
    [(H.ROLLED, b"2147483648")],
    [(H.ROLLED, b"3"), (H.TIMER_DELIVER_MS, b"9223372036854775808"), (H.UNIQ_KEY, b"u")],
    [(H.ROLLED, b"-9223372036854775809"), (H.TIMER_DELIVER_MS, b"1")],
    [(H.ROLLED, b"2:" + b"0" * 32), (H.TIMER_DELIVER_MS, b"1"), (H.UNIQ_KEY, b"u")],
    [(H.HEARTBEAT, b"1")],
    [(H.DELAY, b"9223372036854775808")],
    [(H.DELAY, "٣".encode())],
    [(H.DELAY, b" 1")],
    [(H.DELAY, b"1"), (H.REAL_QID, b"2147483648")],
    [(H.TIMER_DELIVER_MS, b"9223372036854775807")],
    [(H.TIMER_DELAY_SEC, b"9223372036854775807")],
    [(H.TIMER_DELAY_MS, b"-1")],
    [(H.TIMER_DEL_UNIQKEY, b"k"), (H.TIMER_DELIVER_MS, b"-9223372036854775808")],
    [(H.TIMER_DEL_UNIQKEY, b"k"), (H.ROLLED, b"1")],
    [(H.REAL_QID, "٣".encode())],
]


def test_records_at_the_edges_never_stop_the_job_running_or_starting(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir, lateness_log):
    """Each edge record, sent while the job runs and again while it is down (so its restart
    reads them first): the job keeps running and starts, each record is dead-lettered once with
    its reason, and the messages around them are delivered once, on time."""
    import uuid

    from streaming.producer import DelayProducer
    from tests.integration.conftest import Sent
    from tests.support import check_deliveries

    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    checkpoint = str(work_dir / f"ckpt-edges-{uuid.uuid4().hex[:8]}")
    sent: dict = {}
    expected: dict[bytes, str] = {}

    def send_round(tag: str) -> None:
        with DelayProducer(settings) as neighbours:
            for i in range(2):
                h = neighbours.send(real, f"{tag}-before-{i}".encode(), level=2 - i)
                sent[h.uniq_key] = Sent(None, f"{tag}-before-{i}".encode(), [], h.due_ms)
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=65536)
        for i, headers in enumerate(EDGE_RECORDS):
            value = f"{tag}-edge-{i}".encode()
            headers = [(H.REAL_TOPIC, real.encode()), *headers]
            meta = producer.send(settings.intake_topic, value, headers=headers).get(timeout=30)
            e = parse(headers, meta.partition, meta.offset, meta.timestamp, rules_of(settings, ""),
                      now_ms=meta.timestamp)
            assert e.kind == Kind.DEAD, (headers, e)
            expected[value] = e.reason.partition(": ")[0]
        producer.close()
        with DelayProducer(settings) as neighbours:
            for i in range(2):
                h = neighbours.send(real, f"{tag}-after-{i}".encode(), level=1 + i)
                sent[h.uniq_key] = Sent(None, f"{tag}-after-{i}".encode(), [], h.due_ms)

    def dead_letters(tag: str) -> list:
        want = {v for v in expected if v.startswith(tag.encode())}
        return [r for r in consume_all(kafka_bootstrap, settings.dlq_topic, expected=0,
                                       timeout_s=90, idle_s=2,
                                       done=lambda got: {r.value for r in got} >= want)
                if r.value.startswith(tag.encode())]

    job = start_job(settings, checkpoint=checkpoint)
    send_round("running")
    running = dead_letters("running")
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=2)
    late: list[int] = []
    check_deliveries(records, sent, lateness_log=late)
    lateness_log.extend(late)
    assert max(late) < 4_000, f"neighbours late by {max(late)} ms"
    assert job.query.isActive and job.failure() is None
    job.stop()

    send_round("down")
    job = start_job(settings, checkpoint=checkpoint)
    up_ms = int(time.time() * 1000)
    down = dead_letters("down")
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=60, idle_s=3)
    check_deliveries(records, sent, late_ms=10_000, after_ms=up_ms)
    assert job.query.isActive and job.failure() is None
    assert sorted(r.value for r in running + down) == sorted(expected), "each once"
    everything = consume_all(kafka_bootstrap, settings.dlq_topic, expected=len(expected))
    assert len(everything) == len(expected), "nothing else: the job's own heartbeats are sealed"
    for record in running + down:
        label = header_map(record)[H.DLQ_REASON].decode().partition(": ")[0]
        assert label == expected[record.value], (record.value, label)
