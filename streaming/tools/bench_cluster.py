"""The bench's `cluster` scenario: `delayq submit` on a local Spark
standalone cluster of two Workers, a constant load at the plan's rate over its levels, and
where the deliveries left from: the ledger topic's records name the process that sent their
rows (streaming/dispatch/rules.py SENDER), whose working folder is an executor's. Then the plan's burst
of timers due together: the driver's memory peak in it against the constant load's, where the
driver is a process of its own (in `local[*]` it is also the executor that holds the burst).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from streaming.tools import cluster

WORKERS, SLOTS = 2, 4   # the cluster: two Workers of four task slots each


def deliveries_by_sender(settings, ledger_topic: str, timeout_s: float = 10.0) -> dict[str, int]:
    """Delivered rows on the ledger topic per sending process ("host:pid:folder")."""
    from kafka import KafkaConsumer

    from streaming.ledger.records import SENDER, ledger_rows
    from streaming.kafka.config import python_client_config

    consumer = KafkaConsumer(ledger_topic, auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=int(timeout_s * 1000),
                             **python_client_config(settings))
    counts: dict[str, int] = {}
    try:
        for record in consumer:
            if not record.value:   # a probe
                continue
            status = ledger_rows(record.value).column("status").to_pylist()
            sender = dict(record.headers)[SENDER].decode()
            counts[sender] = counts.get(sender, 0) + status.count("delivered")
    finally:
        consumer.close()
    return counts


def per_executor(senders: dict[str, int], cluster_home: Path) -> dict[str, int]:
    """The senders' deliveries by executor ("worker-N executor M", from the executor's working
    folder `<home>/worker-N/app-…/M`), and any sent from elsewhere under "driver"."""
    counts: dict[str, int] = {}
    for sender, n in senders.items():
        folder = Path(sender.split(":", 2)[2])
        name = (f"{folder.parent.parent.name} executor {folder.name}"
                if cluster_home in folder.parents else "driver")
        counts[name] = counts.get(name, 0) + n
    return counts


def _burst(bench, intake: str) -> dict:
    """The plan's burst of timers due together, `burst_lead_s` after it is sent."""
    import numpy as np

    from streaming.tools.bench_load import Load, fresh_topic

    settings, plan = bench.settings, bench.plan
    load = Load(settings, bench.work, fresh_topic(bench.admin, "bench-cluster-burst"),
                "cluster-burst")
    due = int((time.time() + plan.burst_lead_s) * 1000) // 1000 * 1000
    load.start_reader(timeout_s=plan.burst_lead_s + 900)
    load.produce(intake, plan.burst, 0, plan.size, deliver_at_ms=due,
                 partitions=len(settings.level_delays_ms))
    figures = load.finish(plan.burst)
    figures["within_10s"] = int(np.sum(figures["_series"][1] <= 10_000))
    return {k: v for k, v in figures.items() if not k.startswith("_")}


def run(bench) -> dict:
    from streaming.tools.bench_load import Load, child_env, fresh_topic, stop_child, wait_for_line
    from streaming.cli.arguments import STARTED
    from streaming.tools.process import free_ports

    settings, plan, work = bench.settings, bench.plan, bench.work
    port, webui = free_ports(2)
    spec = cluster.ClusterSpec(home=work / "spark-cluster", port=port, webui_port=webui,
                               workers=WORKERS, worker_cores=SLOTS, worker_memory="1g")
    cluster.start(spec)
    intake = f"{settings.intake_topic}-cluster"
    env = child_env(os.environ, bench.overrides)
    env.update(DELAYQ_INTAKE_TOPIC=intake, DELAYQ_DLQ_TOPIC=f"{intake}.DLQ",
               DELAYQ_DATA_DIR=str(work / "cluster-data"), DELAYQ_METRICS_PORT=str(free_ports(1)[0]))
    log = work / "cluster-job.log"
    job = None
    try:
        with open(log, "ab") as out:
            job = subprocess.Popen(
                [sys.executable, "-m", "streaming.cli.main", "submit", "--master", spec.master_url,
                 "--total-executor-cores", str(WORKERS * SLOTS)],
                env=env, cwd=Path(__file__).resolve().parents[2], stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_line(job, log, STARTED, timeout_s=300)
        load = Load(settings, work, fresh_topic(bench.admin, "bench-cluster"), "cluster")
        count = int(plan.rate * plan.seconds)
        longest = max(settings.level_delays_ms[lv - 1] for lv in plan.levels)
        load.start_reader(timeout_s=plan.seconds + longest / 1000 + 600)
        done = load.wait_producer(load.produce(intake, count, plan.rate, plan.size,
                                               levels=plan.levels, wait=False,
                                               partitions=len(settings.level_delays_ms)))
        figures = load.finish(count)
        figures["in_msg_s"] = done["rate"]
        time.sleep(12)   # the last ledger records (ledger rows follow deliveries)
        figures["deliveries_per_executor"] = per_executor(
            deliveries_by_sender(settings, f"{intake}.LEDGER"), spec.home)
        figures["cluster"] = f"{WORKERS} workers x {SLOTS} slots"
        if plan.burst:
            figures["load_memory"] = bench.memory.window_peaks()
            figures["burst"] = burst = _burst(bench, intake)
            for what in ("lost", "early"):   # the run's checks read the scenario's own
                figures[what] += burst[what]
            figures["burst_memory"] = bench.memory.window_peaks()
            figures["driver_rss_burst_to_load"] = round(
                figures["burst_memory"]["driver_rss_peak_mb"]
                / max(1, figures["load_memory"]["driver_rss_peak_mb"]), 2)
        return figures
    finally:
        stop_child(job)
        cluster.stop(spec)
