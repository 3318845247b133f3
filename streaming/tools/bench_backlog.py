"""The `backlog` scenario: many timers pending over 2 h … 30 days (the cold tier), taken in
between two runs of a near load."""
from __future__ import annotations

import time
from pathlib import Path

from streaming.tools.bench_figures import du, public
from streaming.tools.bench_load import Load, fresh_topic


def run(bench) -> dict:
    """A large pending backlog: timers due over 2 h … 30 days (random bodies), taken in
    while a near load runs before and after it. Figures: the near load's lateness with
    the backlog pending (and without, as `without_backlog`, the same run), how fast the
    backlog was taken in, the bytes it keeps on disk, the memory peaks meanwhile."""
    if bench.job is None:
        # A young JVM would make the load before the backlog the slower one: warm it first.
        bench._constant("backlog-warm", bench.plan.backlog_rate, bench.plan.backlog_seconds)
    before = bench._constant("backlog-before", bench.plan.backlog_rate, bench.plan.backlog_seconds)
    cold0 = sum(s.count("cold") for s in bench.summaries)
    far = Load(bench.settings, bench.work, fresh_topic(bench.admin, "bench-far"), "backlog-far")
    now_ms = int(time.time() * 1000)
    hour, day = 3_600_000, 86_400_000
    t0 = time.time()
    producer = far.produce(bench.settings.intake_topic, bench.plan.backlog, 0, bench.plan.size,
                           deliver_at_ms=now_ms + 2 * hour,
                           deliver_spread_ms=30 * day - 3 * hour, random_bodies=True,
                           partitions=len(bench.settings.level_delays_ms), wait=False)
    far.wait_producer(producer)
    produce_s = time.time() - t0
    # Taken in: every backlog message written to the cold tier (never due in the run).
    deadline = time.time() + 600 + bench.plan.backlog / 1_000
    parked = 0
    while time.time() < deadline:
        parked = sum(s.count("cold") for s in bench.summaries) - cold0
        if parked >= bench.plan.backlog:
            break
        time.sleep(1)
    taken_s = time.time() - t0
    after = bench._constant("backlog-after", bench.plan.backlog_rate, bench.plan.backlog_seconds)
    cold_rows = bench.spark.read.format("delta").load(str(bench.settings.cold_path)).count()
    cold_bytes = du(Path(bench.settings.cold_path))
    figures = dict(after)
    figures.update(
        lost=before["lost"] + after["lost"], early=before["early"] + after["early"],
        backlog=bench.plan.backlog, parked=parked, cold_rows=cold_rows,
        not_parked=max(0, bench.plan.backlog - cold_rows),
        produce_s=round(produce_s, 1), taken_in_s=round(taken_s, 1),
        taken_in_msg_s=round(parked / taken_s, 1) if taken_s else None,
        cold_tier_bytes=cold_bytes,
        cold_bytes_per_message=round(cold_bytes / max(1, cold_rows), 1),
        wheel_state_bytes=du(bench.work / "ckpt" / "state"),
        without_backlog=public(before))
    for what in ("lateness_p50_ms", "lateness_p99_ms", "batch_p50_ms"):
        if before.get(what) and after.get(what):
            figures[what.replace("_ms", "_ratio")] = round(after[what] / before[what], 3)
    return figures
