"""The bench's `restart` scenario: a `delayq run` child killed with SIGKILL while level-2
messages are pending, and started again; from the kill, its first overdue and first new
deliveries, and each run's start-up figure. With `restart_backlog`, an outage's backlog.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np

from streaming.tools.bench_figures import outage_figures, stamps_of
from streaming.tools.bench_load import PROJECT, Load, child_env, fresh_topic, stop_child, wait_for_line
from streaming.cli.arguments import STARTED

def run(bench) -> dict:
    """A `delayq run` child killed with SIGKILL while level-2 messages are pending, and
    started again after `restart_down_s` (at once by default): seconds from the restart to
    its first delivery. With `restart_backlog`, that many level-1 messages for the same
    real topic come in while it is down (an outage's backlog): figures under `outage`."""
    plan = bench.plan
    real = fresh_topic(bench.admin, "bench-restart")
    load = Load(bench.settings, bench.work, real, "restart")
    from streaming.tools.process import kill_session

    # A job of its own: its own intake and data folder (the checkpoint guard rightly
    # refuses a fresh checkpoint on an intake another run has read).
    intake = f"{bench.settings.intake_topic}-restart"
    run = _launcher(bench, intake)
    # The load runs 20 s before the kill, through the downtime, and 12 s after the restart.
    count = int(plan.restart_rate * (32 + plan.restart_down_s))
    # The outage's backlog: the same real topic (one the killed run delivered to), its own
    # sequence numbers after the load's.
    outage = (Load(bench.settings, bench.work, real, "restart-outage", seq_base=count)
              if plan.restart_backlog else None)
    job = run()
    # Up and delivering before the kill: its first batch done ("delayq started in", which
    # `delayq run` prints then) and 20 s of the load behind it. A fixed wait from the
    # intake's creation and 8 s of load let the kill land while a slow host's job was
    # still in its first batches (start-up 25-33 s that day), with none of its messages
    # fired ahead yet: the scenario measured a job killed during its start.
    wait_for_line(job, bench.work / "restart-job.log", STARTED, timeout_s=300)
    # The readers read from the topic's start: started now, they leave the job's start alone.
    load.start_reader(timeout_s=600 + plan.restart_down_s, count=count)
    if outage:
        outage.start_reader(timeout_s=900 + plan.restart_down_s, count=plan.restart_backlog)
    producer = load.produce(intake, count, plan.restart_rate,
                            plan.size, levels=(2,),
                            partitions=len(bench.settings.level_delays_ms), wait=False)
    time.sleep(20)
    kill_session(job)
    killed = time.time()
    if outage:
        outage.produce(intake, plan.restart_backlog, 0, plan.size, levels=(1,),
                       partitions=len(bench.settings.level_delays_ms))
    time.sleep(max(0.0, killed + plan.restart_down_s - time.time()))
    restarted = time.time()
    job = run()
    if job.poll() is not None:
        raise RuntimeError(f"the restarted job exited; see {bench.work / 'restart-job.log'}")
    load.wait_producer(producer)
    figures = load.finish(count)
    held = outage.finish(plan.restart_backlog) if outage else None
    stop_child(job, 60)
    return _figures(bench, figures, held, killed, restarted)


def _launcher(bench, intake: str):
    """What starts the scenario's `delayq run` child on `intake`, its output appended to
    restart-job.log."""
    from streaming.tools.process import free_ports

    env = child_env(os.environ, bench.overrides)
    env.update(DELAYQ_METRICS_PORT=str(free_ports(1)[0]), DELAYQ_INTAKE_TOPIC=intake,
               DELAYQ_DLQ_TOPIC=f"{intake}.DLQ",
               DELAYQ_DATA_DIR=str(bench.work / "restart-data"))
    logfile = open(bench.work / "restart-job.log", "ab")

    def run():
        # A session of its own, so the kill takes the whole job, its Spark JVM and Python
        # workers with it, as a lost pod or machine would.
        return subprocess.Popen([sys.executable, "-m", "streaming.cli.main", "run"], env=env,
                                cwd=PROJECT, stdout=logfile, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return run


def _figures(bench, figures: dict, held: dict | None, killed: float, restarted: float) -> dict:
    """The load's figures with the restart's: down time, first deliveries after the restart
    and the kill, each run's start-up, and the outage's backlog."""
    restarted_ms = restarted * 1000
    figures["down_s"] = round(restarted - killed, 1)
    stamps = stamps_of(figures)
    after = stamps[stamps >= restarted_ms]
    # Any message: what the killed run had fired into the ready topic comes first.
    figures["first_delivery_after_restart_s"] = (
        round((after.min() - restarted_ms) / 1000, 1) if len(after) else None)
    # A message the killed job never read: through the restarted query's batches.
    new = stamps[figures["_sent_ms"] >= restarted_ms]
    figures["first_new_delivery_after_restart_s"] = (
        round((new.min() - restarted_ms) / 1000, 1) if len(new) else None)
    figures["delivered_before_kill"] = int(np.sum(stamps < restarted_ms))
    # A message that came due after the kill: on time had the job not been killed.
    overdue = stamps[(figures["_series"][0] >= killed * 1000) & (stamps >= restarted_ms)]
    figures["kill_to_first_overdue_delivery_s"] = (
        round((overdue.min() - killed * 1000) / 1000, 1) if len(overdue) else None)
    # Each run's own "delayq started in" figure: the first start, on a fresh data folder,
    # and the restart, on the killed run's checkpoint.
    starts = re.findall(rb"delayq started in ([\d.]+) s",
                        (bench.work / "restart-job.log").read_bytes())
    if len(starts) >= 2:
        figures["started_s"], figures["restarted_s"] = float(starts[-2]), float(starts[-1])
    if held is not None:
        figures["outage"] = outage_figures(held, restarted_ms)
        for what in ("lost", "early", "duplicates"):
            figures[what] += held[what]
    return figures

