"""Property tests of the header rules: any headers a producer can write, in any encoding,
parse to a decision (never an exception), a dead letter always says why, and nothing a
producer writes moves a message before its time."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from state import headers as H
from state.columns import HEADERS
from state.envelope import TIMER_LEVEL, Kind, Rules, parse
from state.parse import parse_batch
from tests.support import KEY, rolled_header

RULES = Rules(level_delays_ms=(1_000, 5_000, 10_000, 60_000), intake_topic="intake",
              dlq_topic="intake.DLQ", allowed_topics=frozenset(), max_delay_ms=86_400_000,
              clock_tolerance_ms=60_000, near_horizon_ms=600_000, cold_bucket_ms=3_600_000,
              timer_parts=8, ring_horizon_ms=0, rolls_to_ring=False, seal_key=KEY,
              legacy_before=())
APPEND = 1_700_000_000_000

CONTRACT_NAMES = sorted(H.CONTROL_HEADERS - {H.HEARTBEAT})
names = st.one_of(st.sampled_from(CONTRACT_NAMES), st.text(max_size=20))
numbers = st.integers(-2**70, 2**70).map(lambda n: str(n).encode())
values = st.one_of(st.none(), st.binary(max_size=40), numbers,
                   st.text(max_size=20).map(lambda t: t.encode("utf-8")),
                   st.sampled_from([b"", b" 3 ", b"1e3", b"\xff\xfe", b"0x10", "３".encode()]))
header_lists = st.lists(st.tuples(names, values), max_size=8)
append_times = st.integers(0, 2**42)


@settings(max_examples=3000)
@given(header_lists, st.integers(0, 2**31 - 1), st.integers(0, 2**62), append_times,
       st.integers(-120_000, 120_000))
def test_any_headers_parse_to_a_decision_and_a_dead_letter_says_why(
        headers, partition, offset, append_ms, clock_skew):
    e = parse(headers, partition, offset, append_ms, RULES, now_ms=append_ms + clock_skew)
    assert isinstance(e.kind, Kind)
    assert e.uniq_key
    if e.kind == Kind.DEAD:
        assert e.reason and e.reason.strip()
    if e.kind in (Kind.NOW, Kind.DELAY, Kind.COLD):
        assert e.real_topic and e.real_topic not in (RULES.intake_topic, RULES.dlq_topic)
        assert not e.real_topic.startswith("__")
        # Delivered headers never carry control headers through.
        out = parse_batch(_intake(append_ms, headers=headers), RULES, 1_000, 2,
                          append_ms + clock_skew)
        assert out.column("kind").to_pylist() == [e.kind.value]
        assert not set(out.column("hkeys").to_pylist()[0]) & H.CONTROL_HEADERS


@settings(max_examples=2000)
@given(append_times, st.integers(1, 4), st.lists(st.tuples(st.text(max_size=10), values),
                                                 max_size=5))
def test_level_due_time_comes_from_the_broker_append_time_only(append_ms, level, user):
    """User headers (anything not in the contract) and their values never change when a
    level message is due: only the broker's append time and the level do."""
    user = [(n, v) for n, v in user if n not in H.CONTROL_HEADERS]
    base = [(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())]
    plain = parse(base, 0, 1, append_ms, RULES, now_ms=append_ms)
    noisy = parse(user + base + user, 0, 1, append_ms, RULES, now_ms=append_ms)
    assert plain.kind != Kind.DEAD
    assert plain.due_ms == noisy.due_ms == append_ms + RULES.level_delays_ms[level - 1]
    assert plain.kind == noisy.kind


@settings(max_examples=2000)
@given(append_times, st.sampled_from(H.TIMER_HEADERS), st.integers(-2**63, 2**63 - 1),
       st.integers(-120_000, 120_000))
def test_a_timer_is_never_due_before_the_broker_received_it(append_ms, name, value, skew):
    e = parse([(H.REAL_TOPIC, b"orders"), (name, str(value).encode())], 0, 1, append_ms,
              RULES, now_ms=append_ms + skew)
    if e.kind != Kind.DEAD:
        assert e.level == TIMER_LEVEL
        assert append_ms <= e.due_ms <= append_ms + RULES.max_delay_ms


@settings(max_examples=1000)
@given(append_times, st.integers(1, 4), st.integers(-3_600_000, RULES.clock_tolerance_ms))
def test_within_the_clock_tolerance_a_level_is_never_due_before_append_plus_delay(
        append_ms, level, behind):
    """Clocks differ between hosts (DESIGN.md section 3): whether the parsing host's clock
    trails the broker's (`behind` > 0) by up to clock_tolerance or runs ahead of it by any
    amount, a level message is due at its append time plus its delay, on both of the parse's
    paths."""
    now = append_ms - behind
    e = parse([(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())], 0, 1, append_ms,
              RULES, now_ms=now)
    delay = RULES.level_delays_ms[level - 1]
    assert e.due_ms == append_ms + delay
    batch = parse_batch(_intake(append_ms, level), RULES, 1_000, 2, now)
    assert batch.column("due_ms").to_pylist() == [append_ms + delay]


@settings(max_examples=500)
@given(append_times, st.integers(1, 4), st.integers(1, 3_600_000))
def test_a_clock_behind_by_more_than_the_tolerance_moved_and_the_message_is_due_now(
        append_ms, level, beyond):
    """RocketMQ's correctDeliverTimestamp: a due time later than now + the level's delay by
    more than clock_tolerance means a clock moved; the message is due now."""
    now = append_ms - RULES.clock_tolerance_ms - beyond
    e = parse([(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())], 0, 1, append_ms,
              RULES, now_ms=now)
    assert e.due_ms == now
    assert parse_batch(_intake(append_ms, level), RULES, 1_000, 2, now).column(
        "due_ms").to_pylist() == [now]


# The edges of every integer column and of the integer rule (ASCII digits only, no spaces, no
# "+", a long at most): each header the parse reads gets each of them, not only random values.
EDGES = [str(n).encode() for n in (0, 1, -1, 7, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
                                   2**63 - 1, 2**63, -2**63, -2**63 - 1, 10**19, 10**30)]
EDGES += [b"", b"007", b"-0", b" 1", b"1 ", b"+1", b"1\n", "٣".encode(), "１".encode(),
          b"1" * 300, b"x" * 5000, b"\xff", b"1e3", b"0x1f", None]
# A service header's forms: an edge, or an edge with a seal-like tail that was not made with the
# key (the cold tier writes "<level>:<seal>").
SERVICE_EDGES = EDGES + [(v or b"") + b":" + b"0" * 32 for v in EDGES] + [b":", b"1:"]
READ = sorted(H.CONTROL_HEADERS)


def _edge_records() -> list[list]:
    """Every header the parse reads with every edge value: alone, beside a good REAL_TOPIC, and
    inside an otherwise good timer, level, cancel, rolled record and heartbeat."""
    good = {H.REAL_TOPIC: b"orders", H.UNIQ_KEY: b"u1", H.DELAY: b"2",
            H.TIMER_DELIVER_MS: str(APPEND + 5_000).encode()}
    shapes = [[], [H.REAL_TOPIC], [H.REAL_TOPIC, H.DELAY], [H.REAL_TOPIC, H.TIMER_DELIVER_MS],
              [H.REAL_TOPIC, H.UNIQ_KEY, H.TIMER_DELIVER_MS, H.ROLLED], [H.HEARTBEAT],
              [H.TIMER_DEL_UNIQKEY, H.TIMER_DELIVER_MS]]
    records = []
    for name in READ:
        for value in SERVICE_EDGES if name in (H.ROLLED, H.HEARTBEAT) else EDGES:
            for shape in shapes:
                base = {n: good.get(n, b"1") for n in shape}
                base[name] = value
                records.append(list(base.items()))
    return records


def test_edge_values_of_every_header_the_parse_reads_are_decided_per_record():
    """The crash found in the field: DELAYQ_ROLLED=2147483648 beside a REAL_TOPIC failed the
    wheel's whole batch (a level beyond int32). Every such record is decided on both of the
    parse's paths, in one batch with good neighbours, as `parse` decides it alone; a dead one
    says why, no unsealed roll is honoured and no heartbeat hides a message."""
    records = _edge_records()
    neighbour = [(H.REAL_TOPIC, b"orders"), (H.DELAY, b"2")]
    batch = _intake(APPEND, rows=[neighbour, *records, neighbour])
    for common in (True, False):
        out = parse_batch(batch, RULES, 1_000, 2, APPEND, common=common).to_pydict()
        for i, headers in enumerate(records, start=1):
            alone = parse(headers, 0, i, APPEND, RULES, APPEND)
            assert out["kind"][i] == alone.kind.value, headers
            assert (out["due_ms"][i], out["level"][i]) == (alone.due_ms, alone.level), headers
            if alone.kind == Kind.DEAD:
                assert out["reason"][i] and not out["reason"][i].startswith("unparsable"), headers
            assert not alone.rolled, headers
            if alone.kind == Kind.HEARTBEAT:   # a clock tick: nothing else
                assert [name for name, _ in headers] == [H.HEARTBEAT], headers
        assert out["kind"][0] == out["kind"][-1] == Kind.DELAY.value


service_values = st.one_of(st.sampled_from(SERVICE_EDGES), st.binary(max_size=40),
                           st.integers(-2**64, 2**64).map(lambda n: f"{n}:".encode()
                                                          + b"ab" * 16))


@settings(max_examples=1000)
@given(st.lists(st.tuples(st.sampled_from(READ), st.one_of(st.sampled_from(EDGES),
                                                           service_values)), max_size=6),
       append_times)
def test_no_header_a_producer_writes_is_honoured_as_the_services_own(headers, append_ms):
    """Without the checkpoint's key no record is a rolled message, whatever its headers, and
    a heartbeat hides no message (it has no other control header); a record with either
    header is dead-lettered, as forged or for another reason, unless it is a bare tick."""
    e = parse(headers, 0, 1, append_ms, RULES, now_ms=append_ms)
    assert not e.rolled
    names = [name for name, _ in headers]
    if e.kind == Kind.HEARTBEAT:
        assert set(names) == {H.HEARTBEAT} and len(names) == 1
    elif H.ROLLED in names or H.HEARTBEAT in names:
        assert e.kind == Kind.DEAD and e.reason
    out = parse_batch(_intake(append_ms, headers=headers), RULES, 1_000, 2, append_ms)
    assert out.column("kind").to_pylist() == [e.kind.value]


def test_the_services_own_records_are_honoured_with_their_seal_only():
    seal = rolled_header(3, APPEND + 9_000, "u1", "orders", 4)
    rolled = [(H.REAL_TOPIC, b"orders"), (H.REAL_QID, b"4"), (H.UNIQ_KEY, b"u1"),
              (H.TIMER_DELIVER_MS, str(APPEND + 9_000).encode()), seal]
    e = parse(rolled, 0, 1, APPEND, RULES, APPEND)
    assert (e.kind, e.level, e.due_ms, e.rolled) == (Kind.DELAY, 3, APPEND + 9_000, True)
    # The seal covers level, due time, topic, partition and UNIQ_KEY: any changed is a forgery.
    for changed in ((H.UNIQ_KEY, b"u2"), (H.TIMER_DELIVER_MS, str(APPEND + 1).encode()),
                    (H.REAL_TOPIC, b"other"), (H.REAL_QID, b"5"),
                    rolled_header(3, APPEND + 9_000, "u1", "orders", 4, key="0" * 64),
                    (H.ROLLED, seal[1].replace(b"3:", b"2:"))):
        forged = [changed if name == changed[0] else (name, v) for name, v in rolled]
        e = parse(forged, 0, 1, APPEND, RULES, APPEND)
        assert e.kind == Kind.DEAD and e.reason.startswith("forged_header"), changed
    e = parse([h for h in rolled if h[0] != H.REAL_QID], 0, 1, APPEND, RULES, APPEND)
    assert e.kind == Kind.DEAD, "REAL_QID removed"
    # A heartbeat is a bare clock tick: one beside a message would hide it, and is refused.
    assert parse([(H.HEARTBEAT, b"x")], 0, 1, APPEND, RULES, APPEND).kind == Kind.HEARTBEAT
    for forged in ([(H.HEARTBEAT, b"1"), (H.REAL_TOPIC, b"orders")],
                   [(H.HEARTBEAT, b"1"), (H.DELAY, b"1")]):
        e = parse(forged, 0, 1, APPEND, RULES, APPEND)
        assert e.kind == Kind.DEAD and e.reason.startswith("forged_header"), forged


def test_an_older_delayqs_unsealed_records_are_honoured_below_its_offsets_only():
    """On a checkpoint an older delayq wrote, what it rolled and had not yet read is honoured
    as before: below the intake's end offsets at the upgrade (the stamp's legacy_before)."""
    from dataclasses import replace

    rules = replace(RULES, legacy_before=(0, 100))
    old = [(H.REAL_TOPIC, b"orders"), (H.UNIQ_KEY, b"u1"),
           (H.TIMER_DELIVER_MS, str(APPEND + 9_000).encode()), (H.ROLLED, b"3")]
    assert parse(old, 1, 99, APPEND, rules, APPEND).rolled
    # ... and its integers read by its rule (spaces, a sign, any digits): what it took, it held.
    spaced = [(H.REAL_TOPIC, b"orders"), (H.DELAY, b" +2"), (H.REAL_QID, "٣".encode())]
    e = parse(spaced, 1, 99, APPEND, rules, APPEND)
    assert (e.kind, e.level, e.real_qid) == (Kind.DELAY, 2, 3)
    for partition, offset in ((1, 100), (0, 0), (2, 0)):
        assert parse(old, partition, offset, APPEND, rules, APPEND).kind == Kind.DEAD
        assert parse(spaced, partition, offset, APPEND, rules, APPEND).kind == Kind.DEAD


def _intake(append_ms: int, level: int = 1, headers: list | None = None,
            rows: list[list] | None = None) -> pa.RecordBatch:
    """One level message appended at `append_ms` (or a record with `headers`, or one record per
    header list of `rows`, at offsets 0, 1, …), as Spark's Kafka source hands it over."""
    if rows is None:
        rows = [headers if headers is not None else
                [(H.REAL_TOPIC, b"orders"), (H.DELAY, str(level).encode())]]
    n = len(rows)
    return pa.record_batch({
        "key": pa.array([None] * n, pa.binary()), "value": pa.array([b"v"] * n, pa.binary()),
        "ipart": pa.array([0] * n, pa.int32()),
        "ioff": pa.array(range(n) if n > 1 else [1], pa.int64()),
        "append_ms": pa.array([append_ms] * n, pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in r] for r in rows], HEADERS)})


def test_a_record_the_rules_fail_on_is_dead_lettered_and_a_batch_failure_names_its_records(
        monkeypatch):
    """No rule should raise (the tests above), but if one does, that record is dead-lettered
    as `unparsable` and its neighbours are decided; a batch that fails as a whole is reported
    with the positions of its records, so an operator sees which."""
    import pytest

    import state.parse as parse_module
    from state.errors import ParseError

    bad = [(H.REAL_TOPIC, b"orders"), (H.TIMER_DELAY_MS, b"13")]

    def failing(headers, *args):
        if headers == bad:
            raise RuntimeError("a bug")
        return parse(headers, *args)
    monkeypatch.setattr(parse_module, "parse", failing)
    batch = _intake(APPEND, rows=[[(H.REAL_TOPIC, b"orders"), (H.DELAY, b"9")], bad])
    out = parse_batch(batch, RULES, 1_000, 2, APPEND, common=False).to_pydict()
    assert out["kind"] == ["delay", "dead"]
    assert out["reason"][1].startswith("unparsable: the parse failed on this record "
                                       "(RuntimeError: a bug)")
    monkeypatch.setattr(parse_module, "_envelopes", lambda *a: pa.array([2**40], pa.int32()))
    with pytest.raises(ParseError, match="intake records 0:0-1 failed as a whole"):
        parse_batch(batch, RULES, 1_000, 2, APPEND)
