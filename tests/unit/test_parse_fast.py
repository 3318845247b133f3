"""The parse stage's batch path for common rows (`state.common.common_rows`) against the per-row
rules (`state.envelope.parse`): on generated intake batches, near the common shape and off it,
both give the same ENVELOPE columns, row for row."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from state import headers as H
from state.envelope import Rules
from state.parse import parse_batch
from tests.support import KEY, rolled_header  # noqa: F401

RULES = Rules(level_delays_ms=(1_000, 5_000, 10_000, 60_000), intake_topic="intake",
              dlq_topic="intake.DLQ", allowed_topics=frozenset(), max_delay_ms=86_400_000,
              clock_tolerance_ms=60_000, near_horizon_ms=600_000, cold_bucket_ms=3_600_000,
              timer_parts=8, ring_horizon_ms=0, rolls_to_ring=False, seal_key=KEY,
              legacy_before=())
# Levels that reach beyond the near horizon: the common path must send them to the cold tier.
COLD_RULES = Rules(level_delays_ms=(1_000, 5_000, 10_000, 60_000), intake_topic="intake",
                   dlq_topic="intake.DLQ", allowed_topics=frozenset({"orders", "b.c"}),
                   max_delay_ms=30 * 86_400_000, clock_tolerance_ms=60_000,
                   near_horizon_ms=3_000, cold_bucket_ms=1_000, timer_parts=8, ring_horizon_ms=0,
                   rolls_to_ring=False, seal_key=KEY, legacy_before=())
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

topics = st.sampled_from([b"orders", b"b.c", b" orders ", b"intake", b"intake.DLQ", b"__x",
                          b"a b", b"", b"\xff", "ü".encode(), b"x" * 250, None])
delays = st.one_of(st.sampled_from([b"0", b"1", b"2", b"3", b"4", b"18", b" 2", b"-1", b"+2",
                                    b"02", b"x", b"", "３".encode(), b"1" * 25, None]),
                   st.integers(0, 40).map(lambda n: str(n).encode()))
keys = st.one_of(st.sampled_from([b" k", b"k ", b"\xc3\xa9k", b"k\xc3\xa9", b"\xffk", b"",
                                  b"\x1fk", b"k\t", b"a b", None]),
                 st.binary(max_size=12), st.text(max_size=12).map(lambda t: t.encode("utf-8")),
                 st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True).map(str.encode))
# A timer's value: junk, plain digits, or ("rel", n), made near the batch's append time by
# `timer_value` (n ms after it for TIMER_DELIVER_MS, |n| ms or |n| / 1000 s of delay otherwise).
timer_values = st.one_of(
    st.sampled_from([b"", b"x", b" 5", b"+5", b"-5", b"5 ", b"05", "３".encode(), b"\xff",
                     b"1" * 15, b"9" * 16, b"1" * 25, None]),
    st.integers(0, 10**15 - 1).map(lambda n: str(n).encode()),
    st.integers(-200_000, 2 * 86_400_000).map(lambda n: ("rel", n)))
delay_headers = st.sampled_from([H.DELAY, H.DELAY, *H.TIMER_HEADERS])
extra_names = st.one_of(st.sampled_from(sorted(H.CONTROL_HEADERS)), st.text(max_size=8))
extras = st.lists(st.tuples(extra_names, st.one_of(st.none(), st.binary(max_size=6))),
                  max_size=2)


@st.composite
def row(draw):
    name = draw(delay_headers)
    headers = [(H.REAL_TOPIC, draw(topics)),
               (name, draw(delays if name == H.DELAY else timer_values))]
    if draw(st.booleans()):
        headers.append((H.UNIQ_KEY, draw(keys)))
    if draw(st.integers(0, 3)) == 0:   # off the common shape: more headers, or fewer
        headers += draw(extras)
        if draw(st.booleans()):
            headers.pop(draw(st.integers(0, len(headers) - 1)))
    return draw(st.permutations(headers))


def timer_value(name, value, append_ms):
    if not isinstance(value, tuple):
        return value
    n = value[1]
    return str(append_ms + n if name == H.TIMER_DELIVER_MS
               else abs(n) // 1000 if name == H.TIMER_DELAY_SEC else abs(n)).encode()


def batch(rows, append_ms, partition):
    n = len(rows)
    rows = [[(k, timer_value(k, v, a)) for k, v in r] for r, a in zip(rows, append_ms)]
    return pa.record_batch({
        "key": pa.array([None] * n, pa.binary()),
        "value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        "ipart": pa.array([partition] * n, pa.int32()),
        "ioff": pa.array(range(1_000, 1_000 + n), pa.int64()),
        "append_ms": pa.array(append_ms, pa.int64()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in r] for r in rows], HEADERS),
    })


@settings(max_examples=600, deadline=None)
@given(st.lists(row(), min_size=1, max_size=30), st.integers(0, 2**42),
       st.lists(st.integers(-5_000, 5_000), min_size=30, max_size=30),
       st.integers(-120_000, 120_000), st.integers(-10_000, 10_000), st.integers(1, 4),
       st.sampled_from([RULES, COLD_RULES]), st.integers(0, 17))
def test_the_common_rows_parse_as_the_per_row_rules_parse_them(
        rows, base_ms, jitter, skew, overdue, spread, rules, partition):
    append = [base_ms + jitter[i] for i in range(len(rows))]
    data = batch(rows, append, partition)
    args = (data, rules, 1_000, spread, base_ms + skew, base_ms + overdue)
    fast = parse_batch(*args)
    slow = parse_batch(*args, common=False)
    assert fast.schema == slow.schema
    for name in fast.schema.names:
        assert fast.column(name).to_pylist() == slow.column(name).to_pylist(), name


def test_a_batch_of_common_rows_takes_the_batch_path():
    """The common shape, levels and timers, is really taken at once: a batch path that turned
    every row away would pass the comparison above."""
    import state.common as parse_module

    rows = [[(H.REAL_TOPIC, b"orders"), (H.DELAY, b"2"), (H.UNIQ_KEY, b"k%d" % i)]
            for i in range(50)]
    rows += [[(H.DELAY, b"1"), (H.REAL_TOPIC, b"orders")]] * 50
    rows += [[(H.REAL_TOPIC, b"orders"), (name, b"%d" % value), (H.UNIQ_KEY, b"t%d" % i)]
             for i, (name, value) in enumerate([(H.TIMER_DELIVER_MS, 10**12 + 30_000),
                                                (H.TIMER_DELAY_MS, 30_000),
                                                (H.TIMER_DELAY_SEC, 30)] * 10)]
    names, values = batch(rows, [0] * 130, 0).column("headers").flatten().flatten()
    common = parse_module.common_rows(
        130, np.repeat(np.arange(130), [3] * 50 + [2] * 50 + [3] * 30),
        np.ones(len(names), dtype=bool), names, values,
        np.zeros(130, np.int64), np.arange(130), np.full(130, 10**12), RULES, 1_000, 2, 10**12, 0)
    assert list(common["rows"]) == list(range(130))
    assert list(common["uniq_key"][:2]) == ["k0", "k1"] and common["uniq_key"][50] == "0-50"
    assert set(common["kind"][100:]) == {"delay"} and set(common["level"][100:]) == {-1}
    assert set(common["due_ms"][100:]) == {10**12 + 30_000}


@settings(max_examples=300, deadline=None)
@given(st.lists(row(), min_size=1, max_size=30), st.integers(0, 2**42),
       st.sampled_from([-1, 0, 1_000, 5_000, 10_000, 12_000]), st.booleans(),
       st.sampled_from([0, 8_000, 600_000]), st.booleans())
def test_the_dispatch_takes_exactly_what_is_due_within_its_window(rows, base_ms, window,
                                                                   immediate, ring, rolls):
    """streaming/dispatch/direct.py `is_direct` (and the wheel's JVM copy of it, tested against
    it in tests/integration/test_bad_input.py) splits the intake by the record alone: a dispatch
    task takes every record `parse` finds due (a cancel: its target due) within the window of its
    append, level or timer, and the timers (and their cancels) due within the ring's horizon,
    and no other but dead letters; never a heartbeat or a rolled one."""
    from dataclasses import replace

    from state.split import is_direct

    rules = replace(RULES, ring_horizon_ms=ring, rolls_to_ring=rolls and ring > 0)
    if immediate:   # the common immediate message: REAL_TOPIC and maybe UNIQ_KEY only
        rows = [[h for h in r if h[0] not in H.DELAY_HEADERS] for r in rows]
    data = batch(rows, [base_ms] * len(rows), 0)
    mine = [is_direct([(h["key"], h["value"]) for h in r or []], base_ms, 0, i, rules, window)
            for i, r in enumerate(data.column("headers").to_pylist())]
    parsed = parse_batch(data, rules, 1_000, 2, base_ms).to_pydict()
    for taken, kind, due, level in zip(mine, parsed["kind"], parsed["due_ms"], parsed["level"]):
        if kind == "hb":   # the job's clock tick is the wheel's
            assert not taken
        elif kind != "dead":
            after = due - base_ms
            assert taken == (window >= 0 and kind != "cold" and (
                after <= window or level == -1 and after <= ring)), kind
    assert window >= 0 or not any(mine)


def test_the_split_takes_levels_timers_and_cancels_due_within_the_window():
    from dataclasses import replace

    from state.split import is_direct

    at = 10**12
    direct = lambda headers, window=5_000, rules=RULES, offset=0: is_direct(  # noqa: E731
        [(H.REAL_TOPIC, b"orders"), *headers], at, 0, offset, rules, window)
    assert direct([(H.DELAY, b"2"), ("trace", b"t")]) and direct([])
    assert is_direct(None, at, 0, 0, RULES, 0)
    for short in ([(H.DELAY, b"02")], [(H.TIMER_DELAY_MS, b"5000")], [(H.TIMER_DELAY_SEC, b"5")],
                  [(H.TIMER_DELIVER_MS, str(at + 5_000).encode())],
                  [(H.TIMER_DELIVER_MS, str(at - 30_000).encode())],   # past, within tolerance
                  [(H.TIMER_DELAY_MS, b"-1")],                         # a dead letter's
                  [(H.TIMER_DEL_UNIQKEY, b"k")],                       # no time: at append
                  [(H.TIMER_DEL_UNIQKEY, b"k"), (H.DELAY, b"3"),
                   (H.TIMER_DELIVER_MS, str(at + 5_000).encode())]):
        assert direct(short), short
    for other in ([(H.DELAY, b"3")], [(H.DELAY, None)], [(H.DELAY, b" 1")], [(H.DELAY, b"-1")],
                  [(H.TIMER_DELAY_MS, b"5001")], [(H.TIMER_DELAY_SEC, b"9223372036854775807")],
                  [(H.TIMER_DELIVER_MS, b"-9223372036854775808")],
                  [(H.DELAY, b"1"), (H.TIMER_DELAY_MS, b"1")], [(H.DELAY, b"1"), (H.DELAY, b"1")],
                  [(H.TIMER_DEL_UNIQKEY, b"k"), (H.TIMER_DELIVER_MS, str(at + 5_001).encode())],
                  [(H.HEARTBEAT, b"1")],
                  [(H.ROLLED, b"1"), (H.DELAY, b"1")]):
        assert not direct(other), other
    assert not direct([], window=-1)
    # Below the offsets of the delayq before (Rules.legacy_before): its split, short levels only.
    older = replace(RULES, legacy_before=(10,))
    assert not direct([(H.TIMER_DELAY_MS, b"100")], rules=older, offset=9)
    assert direct([(H.TIMER_DELAY_MS, b"100")], rules=older, offset=10)
    assert direct([(H.DELAY, b"2")], rules=older, offset=9)
    assert not direct([(H.DELAY, b"02")], rules=older, offset=9)


def test_a_rolled_timer_goes_to_its_task_when_the_rolls_feed_the_rings():
    """With Rules.rolls_to_ring, a timer due beyond the ring's horizon of its append waits in the
    cold tier (its bucket aside), and one the cold tier rolled, due within the horizon of the
    roll, is its dispatch task's: left out of the wheel, parsed by the task as the rolled timer
    it is. A rolled level, or a rolled timer without the setting, stays with the wheel."""
    from dataclasses import replace

    from state.split import is_direct

    at, horizon = 10**12, 600_000
    rules = replace(RULES, ring_horizon_ms=horizon, rolls_to_ring=True)
    due = at + 240_000

    def rolled(level: int, append_ms: int = at) -> list:
        return [(H.REAL_TOPIC, b"orders"), (H.UNIQ_KEY, b"k"),
                (H.TIMER_DELIVER_MS, str(due).encode()), rolled_header(level, due, "k", "orders")]
    assert is_direct(rolled(-1), at, 0, 0, rules, 12_000)
    assert not is_direct(rolled(-1), at, 0, 0, replace(rules, rolls_to_ring=False), 12_000)
    assert not is_direct(rolled(-1), due - horizon - 1, 0, 0, rules, 12_000), "beyond the ring"
    assert not is_direct(rolled(3), at, 0, 0, rules, 12_000)
    wheel = parse_batch(batch([rolled(-1)], [at], 0), rules, 1_000, 2, at, window_ms=12_000)
    assert wheel.num_rows == 0
    task = parse_batch(batch([rolled(-1)], [at], 0), rules, 1_000, 2, at).to_pydict()
    assert (task["kind"], task["level"], task["due_ms"], task["rolled"]) == (
        ["delay"], [-1], [due], [True])
    # Plain timers: beyond the horizon cold, whatever their bucket; levels by their bucket.
    for after, kind in ((horizon, "delay"), (horizon + 1, "cold")):
        timer = [(H.REAL_TOPIC, b"orders"), (H.TIMER_DELAY_MS, str(after).encode())]
        for common in (True, False):
            got = parse_batch(batch([timer], [at], 0), rules, 1_000, 2, at, common=common)
            assert got.column("kind").to_pylist() == [kind], (after, common)


def test_a_direct_rows_due_time_is_its_own_whatever_the_hosts_clock():
    """A host clock behind the broker's by less than clock_tolerance leaves the due time at
    append time plus delay (correctDeliverTimestamp's "deliver now" would be early: the
    dispatch reads a message milliseconds after its append); behind by more, the clock moved,
    and the message is due now."""
    rows = [[(H.REAL_TOPIC, b"orders"), (H.DELAY, b"2")]]
    append = 10**12
    for behind, due, kind in ((40, append + 5_000, "delay"),
                              (RULES.clock_tolerance_ms + 1, append - RULES.clock_tolerance_ms - 1,
                               "now")):
        parsed = parse_batch(batch(rows, [append], 0), RULES, 1_000, 2, append - behind)
        assert parsed.column("kind").to_pylist() == [kind]
        assert parsed.column("due_ms").to_pylist() == [due]
