from prometheus_client import CollectorRegistry

from sinks.base import BatchSummary
from sinks.metrics import LATENESS_BUCKETS, Metrics
from streaming.cli.status import quantile, render


def fresh():
    return Metrics(CollectorRegistry(), version="1.2.3", spark_version="4.1.1")


def test_batch_counts_become_counters_and_gauges():
    m = fresh()
    s = BatchSummary(3)
    s.add("tally", 2, None, 1, received=5, pending_delta=5)
    s.add("tally", 0, None, 1, received=2, pending_delta=0)
    s.add("deliver", 0, None, 2)
    s.add("dead", 0, "unknown_topic: REAL_TOPIC 'x' does not exist", 1)
    s.add("cancelled", 2, None, 1)
    m.observe_batch(s)
    r = m.registry
    assert r.get_sample_value("delayq_messages_received_total", {"level": "2"}) == 5
    assert r.get_sample_value("delayq_messages_delivered_total", {"level": "0"}) == 2
    assert r.get_sample_value("delayq_messages_dead_lettered_total", {"reason": "unknown_topic"}) == 1
    assert r.get_sample_value("delayq_messages_cancelled_total") == 1
    assert r.get_sample_value("delayq_pending_messages", {"level": "2"}) == 5
    assert r.get_sample_value("delayq_build_info", {"version": "1.2.3", "spark_version": "4.1.1"}) == 1


def test_the_wheel_counts_fired_messages_and_the_ledger_query_counts_them_delivered():
    """A batch counts what it fired without calling it delivered (`delivered=False`); the
    ledger query's summary reports it once a dispatch task sent it."""
    m = fresh()
    s = BatchSummary(4)
    s.add("deliver", 2, None, 3, delivered=False)
    m.observe_batch(s)
    r = m.registry
    assert s.count("deliver") == 3
    assert r.get_sample_value("delayq_messages_delivered_total", {"level": "2"}) is None
    ledger = BatchSummary(9)   # as streaming/ledger/query.py LedgerWriter._summary builds it
    ledger.add("deliver", 2, None, 3)
    ledger.add("tally", 1, None, 1, 2)   # read from the intake by a dispatch task itself
    ledger.lateness = ([1] * len(LATENESS_BUCKETS), 3, 0.03)
    m.observe_batch(ledger)
    assert r.get_sample_value("delayq_messages_delivered_total", {"level": "2"}) == 3
    assert r.get_sample_value("delayq_messages_received_total", {"level": "1"}) == 2
    assert r.get_sample_value("delayq_pending_messages", {"level": "1"}) == 0
    assert r.get_sample_value("delayq_delivery_lateness_seconds_count") == 3
    assert r.get_sample_value("delayq_delivery_lateness_seconds_bucket", {"le": "0.01"}) == 1


def test_pending_is_the_seed_plus_the_deltas_in_either_order():
    for seed_first in (True, False):
        m = fresh()
        s = BatchSummary(1)
        s.add("tally", 3, None, 1, received=0, pending_delta=-4)
        if seed_first:
            m.add_pending({3: 10})
        m.observe_batch(s)
        if not seed_first:
            m.add_pending({3: 10})
        assert m.registry.get_sample_value("delayq_pending_messages", {"level": "3"}) == 6


def test_pending_adds_what_the_dispatch_tasks_hold_to_the_wheel_s():
    """A fired message leaves the wheel (its delta) but is pending until
    a dispatch task has sent it: the tasks' last commits report how many they hold."""
    m = fresh()
    pending = lambda level: m.registry.get_sample_value("delayq_pending_messages", {"level": level})
    m.add_pending({1: 5})
    m.set_dispatch({1: 3, 2: 4}, {0: -5_000, 1: 20})
    assert (pending("1"), pending("2")) == (8, 4)
    s = BatchSummary(1)
    s.add("tally", 1, None, 1, received=0, pending_delta=-2)   # two fired into the ready topic
    m.observe_batch(s)
    m.set_dispatch({1: 5}, {})
    assert (pending("1"), pending("2")) == (8, 0), "level 2's were all sent"
    offset = lambda p: m.registry.get_sample_value("delayq_dispatch_clock_offset_seconds",
                                                   {"partition": p})
    assert (offset("0"), offset("1")) == (-5.0, 0.02), "each task's clock, as last measured"


def test_lateness_histogram_accumulates_bucket_counts():
    m = fresh()
    s = BatchSummary(1)
    cumulative = [0, 0, 1, 2] + [3] * (len(LATENESS_BUCKETS) - 4)
    s.lateness = (cumulative, 3, 0.2)
    m.observe_batch(s)
    m.observe_batch(s)
    r = m.registry
    assert r.get_sample_value("delayq_delivery_lateness_seconds_bucket", {"le": "0.05"}) == 2
    assert r.get_sample_value("delayq_delivery_lateness_seconds_bucket", {"le": "+Inf"}) == 6
    assert r.get_sample_value("delayq_delivery_lateness_seconds_count") == 6
    assert abs(r.get_sample_value("delayq_delivery_lateness_seconds_sum") - 0.4) < 1e-9


def test_progress_report_sets_watermark_lag_offsets_and_batch_duration():
    m = fresh()
    progress = {
        "durationMs": {"triggerExecution": 750},
        "eventTime": {"watermark": "2026-11-15T12:00:00.000Z"},
        "sources": [{"endOffset": {"in": {"0": 10, "2": 7}},
                     "latestOffset": {"in": {"0": 12, "2": 7}}}],
    }
    now = 1_795_348_801.5  # 2026-11-22T12:00:01.5Z
    m.observe_progress(progress, late_tolerance_ms=7 * 86_400_000, intake_topic="in", now=now,
                       heartbeats=2)
    r = m.registry
    assert abs(r.get_sample_value("delayq_watermark_lag_seconds") - 1.5) < 1e-6
    assert r.get_sample_value("delayq_delay_offset", {"level": "1"}) == 10
    assert r.get_sample_value("delayq_delay_offset", {"level": "3"}) is None, \
        "partition 2 of a 2-level intake holds the heartbeats: not a level"
    assert r.get_sample_value("delayq_intake_offsets_behind") == 2
    assert r.get_sample_value("delayq_batch_duration_seconds_count") == 1


def test_the_retention_headroom_is_retention_less_the_longest_wait_less_the_watermark_lag():
    """delayq_intake_retention_headroom_seconds: what is left of the intake's retention once a
    reference's longest wait and the job's lag behind the clock are taken off it."""
    m = fresh()
    m.set_retention(7 * 86_400_000, 4_260_000)   # 7 d; near horizon + cold bucket + tolerance
    gauge = lambda: m.registry.get_sample_value("delayq_intake_retention_headroom_seconds")
    assert gauge() == 7 * 86_400 - 4_260
    progress = {"eventTime": {"watermark": "2026-11-15T12:00:00.000Z"}}
    m.observe_progress(progress, late_tolerance_ms=7 * 86_400_000, intake_topic="in",
                       now=1_795_348_800 + 3_600)   # an hour behind
    assert abs(gauge() - (7 * 86_400 - 4_260 - 3_600)) < 1e-6
    m.set_retention(-1, 4_260_000)
    assert gauge() == float("inf"), "kept for ever"


def test_status_renders_headline_figures():
    samples = {
        "delayq_messages_received_total": [({"level": "1"}, 10.0)],
        "delayq_messages_delivered_total": [({"level": "1"}, 8.0)],
        "delayq_pending_messages": [({"level": "1"}, 2.0)],
        "delayq_delivery_lateness_seconds_bucket": [({"le": "0.1"}, 4.0), ({"le": "0.5"}, 8.0),
                                                    ({"le": "+Inf"}, 8.0)],
    }
    assert quantile(samples, "delayq_delivery_lateness_seconds", 0.5) == 0.1
    assert quantile(samples, "delayq_delivery_lateness_seconds", 0.99) == 0.5
    text = render(samples)
    assert "received 10" in text and "delivered 8" in text
    assert "p50 ≤0.1 s" in text


def test_a_cancel_parked_in_the_cold_tier_is_no_miss_until_its_bucket_rolls():
    """sinks/cold.py moves the wheel's misses it parks as tombstones out of `cancel_unknown`;
    the roll counts each as cancelled (no longer pending) or, its message never come, a miss."""
    m = fresh()
    s = BatchSummary(5)
    s.add("cancel_unknown", -1, None, 3)
    s.recount("cancel_unknown", "cancel_parked", 2)
    m.observe_batch(s)
    r = m.registry
    assert r.get_sample_value("delayq_cancel_misses_total") == 1
    assert r.get_sample_value("delayq_messages_cancelled_total") == 0
    assert s.count("cancel_parked") == 2
