"""The bench's `first-minute` scenario: what a user sees after a deploy. A `delayq run` child
on a fresh data folder; `FIRST_LOAD_AFTER_S` after it reports started, a minute of the plan's
load (its rate and levels); lateness over that minute, by level, and the start-up's figure.
Compare it with `raw-steady` of the same run (the raw pipe at the same rate) and with the
`steady` scenario's warm job.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

# The load starts this long after "delayq started in", and lasts a minute.
FIRST_LOAD_AFTER_S = 30.0
FIRST_LOAD_S = 60.0


def run(bench) -> dict:
    from streaming.tools.bench_load import Load, child_env, fresh_topic, stop_child, wait_for_line
    from streaming.cli.arguments import STARTED
    from streaming.tools.process import free_ports

    settings, plan, work = bench.settings, bench.plan, bench.work
    intake = f"{settings.intake_topic}-first"
    metrics, ui = free_ports(2)
    env = child_env(os.environ, bench.overrides)
    env.update(DELAYQ_INTAKE_TOPIC=intake, DELAYQ_DLQ_TOPIC=f"{intake}.DLQ",
               DELAYQ_DATA_DIR=str(work / "first-data"), DELAYQ_METRICS_PORT=str(metrics),
               DELAYQ_SPARK_UI_PORT=str(ui))
    log = work / "first-job.log"
    job = None
    try:
        with open(log, "ab") as out:
            job = subprocess.Popen([sys.executable, "-m", "streaming.cli.main", "run"], env=env,
                                   cwd=Path(__file__).resolve().parents[2], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_line(job, log, STARTED, timeout_s=300)
        started = re.findall(rb"delayq started in ([\d.]+) s", log.read_bytes())
        load = Load(settings, work, fresh_topic(bench.admin, "bench-first"), "first")
        count = int(plan.rate * FIRST_LOAD_S)
        longest = max(settings.level_delays_ms[lv - 1] for lv in plan.levels)
        load.start_reader(timeout_s=FIRST_LOAD_S + longest / 1000 + 600)
        time.sleep(FIRST_LOAD_AFTER_S)
        done = load.wait_producer(load.produce(intake, count, plan.rate, plan.size,
                                               levels=plan.levels, wait=False,
                                               partitions=len(settings.level_delays_ms)))
        figures = load.finish(count)
        figures["in_msg_s"] = done["rate"]
        figures["started_s"] = float(started[-1]) if started else None
        figures["load_after_started_s"] = FIRST_LOAD_AFTER_S
        return figures
    finally:
        stop_child(job)
