"""`delayq bench`: throughput and lateness of the whole path, against the raw Kafka pipe.

Scenarios, in one run on one broker and one Spark session:
  raw     the raw pipe: messages copied from a topic to another by a plain Spark Kafka
          query with the job's trigger and batch bound (no parse, no state, no hold);
          a preloaded backlog drained, in msg/s.
  raw-steady
          the raw pipe under the steady load: its transit (append to copy), the floor
          under the steady scenario's lateness of a level (transit minus its delay).
  drain   delayq on the same preloaded backlog (level-1 messages, all overdue when the job
          starts): parse, wheel, ready topic, dispatch, ledger. Its ratio to raw is the headline.
  steady  delayq under a constant rate over chosen levels: lateness p50/p95/p99/max, early,
          lost, duplicates, throughput in and out, batch durations.
  timers  timers of every header form at the steady rate, due within `timers_spread_s`, a fifth
          within 3 s or in the past: lateness per band of due time after append (the direct
          window and beyond it) (streaming/tools/bench_timers.py).
  burst   many timer messages due in the same second: how long after it the last one left.
  scattered
          timers due uniformly over the next 10 minutes, measured after 10 minutes of fill:
          the index's worst case, and the bytes the wheel keeps per pending message
          (streaming/tools/bench_scattered.py).
  backlog many timers pending over 2 h … 30 days (cold tier), taken in between two runs of
          a near load: its lateness with and without the backlog, take-in rate, disk, memory
          (streaming/tools/bench_backlog.py).
  restart a `delayq run` child SIGKILLed 20 s into a load and started again: start-up, first
          deliveries after it, optionally after a downtime's backlog (bench_restart.py).
  first-minute
          a fresh `delayq run`, a minute of the steady load from 30 s after it started
          (streaming/tools/bench_start.py).
Lateness is the delivered record's broker timestamp minus its due time (the intake append
time plus the level's delay, or the timer's deliver time). The load generator and the reader
run as child processes (streaming/tools/loadgen.py). Writes a JSON result and a PNG of lateness.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import numpy as np

from conf.settings import Settings
from state.errors import ConfigError
from streaming.tools.bench_figures import (after_warmup, batch_figures, cpu_probe_ms, cpu_used,
                                     driver_cost, ended_since, last_batch,
                                     last_delivery_ms, lateness_floor, processing_rate,
                                     public, step_figures, timeline, write)
from streaming.tools.bench_load import Load, MemoryPeaks, fresh_topic, tidy


# The order the scenarios run in: the raw pipe's queries first, then the drain, which needs a
# new job on a backlog; the steady load, burst and backlog run on the job it leaves (or start
# one); restart and first-minute run their own, and cluster its own on a local standalone
# cluster (asked for by name: streaming/tools/bench_cluster.py).
SCENARIOS = ("raw", "raw-steady", "drain", "steady", "timers", "burst", "scattered", "backlog",
             "restart", "first-minute", "cluster")
# The scenarios in modules of their own, and those of them that run a job of their own.
SCENARIO_MODULES = {"raw": "streaming.tools.bench_raw", "raw-steady": "streaming.tools.bench_raw",
                    "scattered": "streaming.tools.bench_scattered",
                    "timers": "streaming.tools.bench_timers",
                    "backlog": "streaming.tools.bench_backlog",
                    "restart": "streaming.tools.bench_restart", "first-minute": "streaming.tools.bench_start",
                    "cluster": "streaming.tools.bench_cluster"}
OWN_JOB = ("restart", "first-minute", "cluster")


def scenarios_of(text: str) -> tuple[str, ...]:
    """`--scenarios`' comma separated names, in the order they run (SCENARIOS); an unknown
    name is a ConfigError naming the known ones."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(SCENARIOS))
    if unknown or not names:
        raise ConfigError(f"--scenarios: unknown scenario {', '.join(unknown) or '(none given)'}; "
                         f"choose from {','.join(SCENARIOS)}")
    return tuple(name for name in SCENARIOS if name in names)


@dataclass
class Plan:
    scenarios: tuple[str, ...] = SCENARIOS[:-1]
    size: int = 1024
    drain: int = 200_000
    # drain: the preload's msg/s (0: as fast as the broker takes it). A backlog sent slowly
    # spreads its append times, and so its due times, over more than the fire lead per batch.
    drain_rate: float = 0
    rate: float = 20_000
    seconds: float = 60
    warmup_s: float = 0
    levels: tuple[int, ...] = (1, 2)
    burst: int = 500_000
    burst_lead_s: float = 90
    timers_spread_s: float = 60   # timers: due within this after their append
    scattered_fill_s: float = 600   # scattered: load before the measured `seconds`
    scattered_spread_s: float = 600   # scattered: timer delays uniform below this
    restart_rate: float = 200
    restart_down_s: float = 0     # restart: seconds the job stays down after the kill
    restart_backlog: int = 0      # restart: level-1 messages sent while it is down
    backlog: int = 10_000_000
    backlog_rate: float = 1_000
    backlog_seconds: float = 30

    @classmethod
    def short(cls) -> "Plan":
        """The CI form: small, quick, fails only on early or lost messages (restart: an outage)."""
        return cls(scenarios=("raw", "raw-steady", "drain", "steady", "timers", "burst",
                              "scattered", "backlog", "restart"), drain=5_000, rate=1_000,
                   seconds=6, warmup_s=3, burst=5_000, burst_lead_s=15, timers_spread_s=15,
                   scattered_fill_s=5, scattered_spread_s=15, backlog=10_000, backlog_rate=500,
                   backlog_seconds=5, restart_down_s=5, restart_backlog=2_000)


@dataclass
class Result:
    plan: dict
    machine: dict
    scenarios: dict = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Early or lost messages in any scenario: the only failures of a bench run."""
        out = []
        for name, figures in self.scenarios.items():
            for what in ("early", "lost", "not_parked"):
                if figures.get(what):
                    out.append(f"{name}: {figures[what]} {what}")
        return out


class Bench:
    def __init__(self, settings: Settings, session: Callable, plan: Plan, work: Path,
                 overrides: dict | None = None, log=lambda line: print(line, flush=True)):
        """`session()` builds the Spark session of the scenarios run in this process."""
        from streaming.kafka.admin import admin_client

        self.settings, self.plan, self.work = settings, plan, work
        self._session, self._spark = session, None
        # The settings a `delayq run` child of the restart scenario needs, as DELAYQ_* values.
        self.overrides = overrides or {}
        self.admin = admin_client(settings)
        self.log = log
        self.job = None
        self.memory: MemoryPeaks | None = None   # the run's sampler (`run`)
        self.summaries: list = []   # every delivery batch's BatchSummary (step timings)

    @property
    def spark(self):
        if self._spark is None:
            self._spark = self._session()
        return self._spark

    def stop_session(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    # -- delayq ------------------------------------------------------------------------------
    def start_job(self):
        from streaming.job import DelayJob

        self.job = DelayJob(self.settings, self.spark, checkpoint=str(self.work / "ckpt"),
                            on_batch=self.summaries.append)
        self.job.start()

    def drain(self) -> dict:
        real = fresh_topic(self.admin, "bench-drain")
        load = Load(self.settings, self.work, real, "drain")
        from streaming.kafka.admin import ensure_topics

        ensure_topics(self.settings, self.admin)
        load.start_reader(timeout_s=900)
        load.produce(self.settings.intake_topic, self.plan.drain, self.plan.drain_rate,
                     self.plan.size, levels=(1,), partitions=len(self.settings.level_delays_ms))
        time.sleep(self.settings.level_delays_ms[0] / 1000 + 0.5)  # all overdue at the start
        first_summary = len(self.summaries)
        self.start_job()
        figures = load.finish(self.plan.drain)
        figures.update(processing_rate(self.job.query, -1, last_delivery_ms(figures)))
        figures["timeline"] = timeline(self.job.query, -1, self.summaries[first_summary:])
        return figures

    def _on_job(self, name: str) -> Load:
        """The running job (started if none) and a load for a fresh real topic."""
        if self.job is None:
            self.start_job()
        return Load(self.settings, self.work, fresh_topic(self.admin, f"bench-{name}"), name)

    def steady(self) -> dict:
        return self._constant("steady", self.plan.rate, self.plan.seconds, self.plan.warmup_s)

    def _constant(self, name: str, rate: float, seconds: float, warmup_s: float = 0,
                  delay_spread_ms: int = 0, timer_mix_ms: int = 0) -> dict:
        """`rate` msg/s for `warmup_s` + `seconds` over the plan's levels (timers delayed up to
        `delay_spread_ms`, or of every form up to `timer_mix_ms`, when given), each on time or
        how late; lateness and batch figures over the `seconds` after the warm-up."""
        load = self._on_job(name)
        count = int(rate * (warmup_s + seconds))
        longest = max(delay_spread_ms, timer_mix_ms, *(self.settings.level_delays_ms[lv - 1]
                                                       for lv in self.plan.levels))
        load.start_reader(timeout_s=warmup_s + seconds + longest / 1000 + 600)
        after = last_batch(self.job.query)
        first_summary = len(self.summaries)
        produced = load.produce(self.settings.intake_topic, count, rate, self.plan.size,
                                levels=self.plan.levels,
                                partitions=len(self.settings.level_delays_ms), wait=False,
                                delay_spread_ms=delay_spread_ms, timer_mix_ms=timer_mix_ms)
        if warmup_s:
            time.sleep(warmup_s)
            after, first_summary = last_batch(self.job.query), len(self.summaries)
        ledger_after = last_batch(self.job.ledger_query) if self.job.ledger_query else -1
        cpu_from = self.memory.cpu_seconds()["bench_python"]   # the driver's, after the warm-up
        done = load.wait_producer(produced)
        loaded_cpu_s = self.memory.cpu_seconds()["bench_python"] - cpu_from
        analysis = time.thread_time()
        figures = load.finish(count)
        if warmup_s:
            figures.update(after_warmup(figures, warmup_s))
            figures["driver_python_cpu_us_per_msg_loaded"] = round(loaded_cpu_s * 1e6 / max(
                1, figures["measured_messages"]), 1)   # without the job's start
        figures.update(in_msg_s=done["rate"], **batch_figures(self.job.query, after))
        ledger = self.job.ledger_query
        if ledger is not None:   # the ledger query, over the same window
            figures["ledger_query"] = {**batch_figures(ledger, ledger_after), "timeline": [
                (p["batchId"], p["durationMs"].get("triggerExecution"),
                 p["durationMs"].get("addBatch"), p["numInputRows"])
                for p in ledger.recentProgress if p["batchId"] > ledger_after]}
        figures["step_p50_s"] = step_figures(self.summaries[first_summary:])
        figures["timeline"] = timeline(self.job.query, after, self.summaries[first_summary:])
        self.memory.exclude(time.thread_time() - analysis)
        return figures

    def burst(self) -> dict:
        load = self._on_job("burst")
        due = int((time.time() + self.plan.burst_lead_s) * 1000) // 1000 * 1000
        load.start_reader(timeout_s=self.plan.burst_lead_s + 900)
        after, first_summary = last_batch(self.job.query), len(self.summaries)
        t0 = time.time()
        load.produce(self.settings.intake_topic, self.plan.burst, 0, self.plan.size,
                     deliver_at_ms=due, partitions=len(self.settings.level_delays_ms))
        produced_s = time.time() - t0
        figures = load.finish(self.plan.burst)
        late = figures["_series"][1]
        figures.update(due_ms=due, produce_s=round(produced_s, 1),
                       lead_s=self.plan.burst_lead_s,
                       within_10s=int(np.sum(late <= 10_000)))
        # The batch that released the burst sends what is due from its tasks and reports its
        # progress (and its summary) only once committed, which can be after the last
        # delivery: wait until a batch has ended after the last delivery, so it has reported.
        last = last_delivery_ms(figures) or 0
        deadline = time.time() + 120
        while not ended_since(self.job.query, last) and time.time() < deadline:
            time.sleep(0.5)
        figures["timeline"] = timeline(self.job.query, after, self.summaries[first_summary:])
        # The batches that released the burst from the wheel: when each began and ended,
        # against the due time (negative: before it), and how many it released.
        figures["fired"] = [
            {"batch": b["batch"], "messages": b["fired"], "start_s": round((b["start_ms"] - due) / 1000, 1),
             "end_s": round((b["start_ms"] + b["ms"] - due) / 1000, 1)}
            for b in figures["timeline"] if b["fired"] >= self.plan.burst // 100]
        return figures

    def _scenario(self, name: str) -> dict:
        """Run one scenario: a method of this class, or a module's `run(bench)`; a module that
        runs its own job (restart, first-minute, cluster) gets the cores, this one stopped."""
        module = SCENARIO_MODULES.get(name)
        if module is None:
            return getattr(self, name.replace("-", "_"))()
        if name in OWN_JOB:
            if self.job is not None:
                self.job.stop()
                self.job = None
            # An idle session here made the child's start 1.3-1.7 s slower (16.6, 17.0 : 15.3 s).
            self.stop_session()
        function = name.replace("-", "_") if name in ("raw", "raw-steady") else "run"
        return getattr(importlib.import_module(module), function)(self)

    def run(self) -> Result:
        machine = {"cores": os.cpu_count(), "spark_master": self.settings.spark_master,
                   "shuffle_partitions": self.settings.spark_shuffle_partitions,
                   "max_offsets_per_trigger": self.settings.max_offsets_per_trigger,
                   "ledger": self.settings.ledger,
                   "cpu_probe_ms": {"before": cpu_probe_ms()}}
        result = Result(plan=self.plan.__dict__.copy(), machine=machine)
        memory = self.memory = MemoryPeaks()
        memory.start()
        try:
            for name in self.plan.scenarios:
                self.log(f"bench: {name} …")
                t0, cpu0 = time.time(), memory.cpu_seconds()
                memory.window_peaks()
                figures = self._scenario(name)
                figures["wall_s"] = round(time.time() - t0, 1)
                figures.update(memory.window_peaks())
                figures.update(cpu_used(cpu0, memory.cpu_seconds(), figures["wall_s"]))
                figures.update(driver_cost(figures))
                result.scenarios[name] = figures
                self.log(f"bench: {name}: " + json.dumps(public(figures)))
        finally:
            if self.job is not None:
                self.job.stop()
            # Before the folder's removal: its state store maintenance still writes the
            # checkpoint's snapshots after the query stops.
            self.stop_session()
            result.machine.update(memory.stop())
            self.admin.close()
        result.machine["cpu_probe_ms"]["after"] = cpu_probe_ms()
        raw, drain = result.scenarios.get("raw"), result.scenarios.get("drain")
        if raw and drain and raw.get("processing_msg_s") and drain.get("processing_msg_s"):
            result.machine["drain_ratio_to_raw"] = round(
                drain["processing_msg_s"] / raw["processing_msg_s"], 3)
        steady = result.scenarios.get("steady")
        floor = lateness_floor(result.scenarios.get("raw-steady"), self.plan.levels,
                               self.settings.level_delays_ms)
        if floor:
            result.machine["steady_lateness_floor_p99_ms"] = floor
        if raw and steady and raw.get("processing_msg_s") and steady.get("out_msg_s"):
            # The rate delayq kept up over the steady load (first to last delivery, several
            # batches on a warmer JVM) against the raw pipe's rate per second of batch time.
            # Meaningful as a throughput when the load exceeds it (out well below in_msg_s).
            result.machine["steady_out_ratio_to_raw"] = round(
                steady["out_msg_s"] / raw["processing_msg_s"], 3)
        return result


def main(overrides: dict, plan: Plan, out: Path | None, plot: Path | None,
         keep_data: bool = False) -> int:
    """The CLI entry: a broker of its own (on free ports) unless Kafka is configured, a Spark
    session, the scenarios; prints the figures, writes them; 1 on early or lost. The run's
    folder under data_dir is removed after a clean run (`tidy`); the result is written beside
    it unless `out` says where."""
    import tempfile

    from conf import load_settings
    from streaming.tools import broker
    from streaming.tools.process import free_ports
    from streaming.spark.session import build_session

    base = load_settings(**overrides)
    base.data_path.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=base.data_path))
    out = out or work.with_suffix(".json")
    tag = uuid.uuid4().hex[:6]
    overrides = {**overrides, "data_dir": str(work / "data"),
                 "intake_topic": f"bench-intake-{tag}", "dlq_topic": f"bench-intake-{tag}.DLQ"}
    spec = None
    problems = None
    if base.embedded:
        port, controller = free_ports(2)
        spec = broker.BrokerSpec(home=work / "kafka", jars=base.jars_path / "kafka",
                                 port=port, controller_port=controller, heap="1g")
        broker.start(spec)
        overrides["bootstrap_servers"] = spec.bootstrap
    try:
        settings = load_settings(**overrides)
        result = Bench(settings, lambda: build_session(settings), plan, work, overrides).run()
        write(result, out, plot or out.with_suffix(".png"))
        print(json.dumps({"machine": result.machine,
                          "scenarios": {k: public(v) for k, v in result.scenarios.items()}},
                         indent=2))
        print(f"bench: wrote {out} and {plot or out.with_suffix('.png')}")
        problems = result.problems()
        for line in problems:
            print(f"bench: FAILED: {line}", file=sys.stderr)
        return 1 if problems else 0
    finally:
        if spec is not None:
            broker.stop(spec)
        print(tidy(work, keep_data, problems))
