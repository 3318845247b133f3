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
  burst   many timer messages due in the same second: how long after it the last one left.
  backlog many timers pending over 2 h … 30 days (cold tier), taken in between two runs of
          the same near load: the near load's lateness with the backlog against without it,
          the rate it was taken in, its bytes on disk, memory peaks.
  restart the job, once up and 20 s into a load, killed (SIGKILL) and started again: time
          from the restart to its first delivery, and to that of a message sent after it;
          optionally after a downtime with a backlog sent meanwhile, and how soon it is out.
  first-minute
          a fresh `delayq run`, a minute of the steady load from 30 s after it started: the
          lateness a deploy's first minute gives (streaming/bench_start.py).
Lateness is the delivered record's broker timestamp minus its due time (the intake append
time plus the level's delay, or the timer's deliver time). The load generator and the reader
run as child processes (streaming/loadgen.py). Writes a JSON result and a PNG of lateness.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conf.settings import Settings
from state.errors import ConfigError
from streaming.cli import STARTED
from streaming.kafka_config import librdkafka_config

PROJECT = Path(__file__).resolve().parents[1]


# The order the scenarios run in: the raw pipe's queries first, then the drain, which needs a
# new job on a backlog; the steady load, burst and backlog run on the job it leaves (or start
# one); restart and first-minute run their own, and cluster its own on a local standalone
# cluster (asked for by name: streaming/bench_cluster.py).
SCENARIOS = ("raw", "raw-steady", "drain", "steady", "burst", "backlog", "restart",
             "first-minute", "cluster")


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
    restart_rate: float = 200
    restart_down_s: float = 0     # restart: seconds the job stays down after the kill
    restart_backlog: int = 0      # restart: level-1 messages sent while it is down
    backlog: int = 10_000_000
    backlog_rate: float = 1_000
    backlog_seconds: float = 30

    @classmethod
    def short(cls) -> "Plan":
        """The CI form: small, quick, fails only on early or lost messages."""
        return cls(scenarios=("raw", "raw-steady", "drain", "steady", "burst", "backlog"),
                   drain=5_000,
                   rate=1_000, seconds=10, warmup_s=5, burst=5_000, burst_lead_s=25, backlog=20_000,
                   backlog_rate=500, backlog_seconds=10)


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


def du(path: Path) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def percentile(values: np.ndarray, q: float) -> int | None:
    return int(np.percentile(values, q, method="higher")) if len(values) else None


class Load:
    """One load generator and one reader for a real topic, as child processes. Loads that
    share a real topic each take their own range of sequence numbers: `seq_base` is this
    one's first, and its reader is told how many it has (`count`) so it skips the others'."""

    def __init__(self, settings: Settings, work: Path, real: str, name: str, seq_base: int = 0):
        self.settings, self.real, self.seq_base = settings, real, seq_base
        self.out = str(work / name)
        self.env = {**os.environ, "DELAYQ_BENCH_SECURITY": json.dumps(librdkafka_config(settings))}
        self.reader = None

    def start_reader(self, timeout_s: float, idle_s: float = 120.0, count: int = 0) -> None:
        self.reader = subprocess.Popen(
            [sys.executable, "-m", "streaming.loadgen", "consume",
             "--bootstrap", self.settings.bootstrap, "--topic", self.real,
             "--out", self.out + "-read.npz", "--timeout", str(timeout_s), "--idle", str(idle_s),
             "--seq-base", str(self.seq_base), "--seq-count", str(count)],
            env=self.env, cwd=PROJECT)

    def produce(self, intake: str, count: int, rate: float, size: int,
                levels: tuple[int, ...] = (1,), deliver_at_ms: int = 0, partitions: int = 1,
                wait: bool = True, deliver_spread_ms: int = 0, random_bodies: bool = False,
                no_delay: bool = False):
        """Sends `count` messages at `rate` (0: at once); each is due its level's delay after
        its append, or at its append with `no_delay` (the raw pipe, which keeps nothing)."""
        delays = ",".join("0" if no_delay else str(d) for d in self.settings.level_delays_ms)
        proc = subprocess.Popen(
            [sys.executable, "-m", "streaming.loadgen", "produce",
             "--bootstrap", self.settings.bootstrap, "--intake", intake, "--real", self.real,
             "--count", str(count), "--rate", str(rate), "--size", str(size),
             "--levels", ",".join(map(str, levels)), "--delays", delays,
             "--deliver-at-ms", str(deliver_at_ms), "--partitions", str(partitions),
             "--deliver-spread-ms", str(deliver_spread_ms),
             *(["--random-bodies"] if random_bodies else []),
             "--run", Path(self.out).name, "--seq-base", str(self.seq_base),
             "--out", self.out + "-sent.npz"],
            env=self.env, cwd=PROJECT)
        if wait:
            self.wait_producer(proc)
        return proc

    def wait_producer(self, proc) -> dict:
        if proc.wait() != 0:
            raise RuntimeError(f"the load generator failed (exit {proc.returncode})")
        done = json.loads(Path(self.out + "-sent.npz.done").read_text())
        if done["failed"]:
            raise RuntimeError(f"the broker refused {done['failed']} bench messages")
        return done

    def finish(self, expected: int) -> dict:
        """Tell the reader how many to expect and when the last is due; wait for it; join
        sends and deliveries."""
        sent = np.load(self.out + "-sent.npz")
        last_due = int(sent["due"].max()) / 1000 if len(sent["due"]) else time.time()
        # Renamed into place: the reader polls for this file and must never read it half
        # written (it once did, and died on the empty JSON).
        told = Path(self.out + "-read.npz.expected")
        told.with_suffix(".partial").write_text(json.dumps(
            {"expected": expected, "quiet_from_s": max(time.time(), last_due)}))
        told.with_suffix(".partial").replace(told)
        self.reader.wait()
        read = np.load(self.out + "-read.npz")
        return join(sent["append"], sent["due"], read["seq"], read["ts"], sent["level"])


def join(append: np.ndarray, due: np.ndarray, seq: np.ndarray, ts: np.ndarray,
         level: np.ndarray | None = None) -> dict:
    """Figures of one scenario from what was sent (per sequence number: append and due time,
    and the level, -1 for a timer) and what was read (sequence number and broker timestamp of
    each delivery)."""
    n = len(due)
    ok = (seq >= 0) & (seq < n)
    seq, ts = seq[ok], ts[ok]
    order = np.argsort(ts, kind="stable")
    seq, ts = seq[order], ts[order]
    first = np.unique(seq, return_index=True)[1]   # the first delivery of each message
    fseq, fts = seq[first], ts[first]
    late = fts - due[fseq]
    delivered = len(fseq)
    span_s = (fts.max() - fts.min()) / 1000 if delivered > 1 else 0.0
    return {
        "messages": int(n), "delivered": int(delivered), "lost": int(n - delivered),
        "duplicates": int(len(seq) - delivered),
        # Early is judged on every copy, duplicates included.
        "early": int(np.sum(ts < due[seq])),
        **lateness(late),
        "out_msg_s": round((delivered - 1) / span_s, 1) if span_s else None,
        **by_level(late, None if level is None else level[fseq]),
        "_series": (due[fseq], late),
        "_sent_ms": append[fseq], "_load_start_ms": int(append.min()) if n else 0,
        "_levels": None if level is None else level[fseq],
    }


def lateness(late: np.ndarray) -> dict:
    return {"lateness_p50_ms": percentile(late, 50), "lateness_p95_ms": percentile(late, 95),
            "lateness_p99_ms": percentile(late, 99),
            "lateness_max_ms": int(late.max()) if len(late) else None}


def by_level(late: np.ndarray, levels: np.ndarray | None) -> dict:
    """Lateness per level ("timer" for -1), where the load had more than one: a short level
    is bounded by how soon the job reads it, a long one by how close to its due time the
    wheel fires it, and one figure over both hides which one is late."""
    if levels is None or len(np.unique(levels)) < 2:
        return {}
    return {"by_level": {("timer" if lv < 0 else str(int(lv))): {
        "messages": int(np.sum(levels == lv)), **lateness(late[levels == lv])}
        for lv in np.unique(levels)}}


def after_warmup(figures: dict, warmup_s: float) -> dict:
    """The lateness of the messages sent after the first `warmup_s` seconds of a load, and
    that of the warm-up apart: a job runs for days, and its first minute (a young JVM still
    compiling) is not its sustained state. Lost, early and duplicates stay over every message."""
    late, levels = figures["_series"][1], figures.get("_levels")
    warm = figures["_sent_ms"] < figures["_load_start_ms"] + warmup_s * 1000
    return {**lateness(late[~warm]), "measured_messages": int(np.sum(~warm)),
            **by_level(late[~warm], None if levels is None else levels[~warm]),
            "warmup": {"seconds": warmup_s, "messages": int(np.sum(warm)), **lateness(late[warm])}}


class MemoryPeaks(threading.Thread):
    """Peak memory of the driver (its JVM and this Python process, together and each alone)
    and of the Python workers, and CPU seconds per role (driver JVM, Python workers, broker,
    load generator, reader, this process), sampled twice a second from /proc.

    The JVM and this process are measured by their resident set (RSS). The Python workers are
    forks of one daemon that share its pages, so they are measured by their proportional set
    (PSS: a page shared by n processes counts 1/n to each), which adds up to what they use
    together; their RSS would count the shared pages once per worker. A child of the JVM that
    still has the JVM's command line is a spawn that has not exec'd yet and shares the JVM's
    memory: it is not counted (counted, it doubled the JVM's peak in earlier backlog runs;
    docs/benchmarks.md)."""

    # First match wins: a JVM's class path names pyspark, and the cluster's driver JVM its
    # main.py. The cluster scenario's executors, Master and Workers, and its driver's Python.
    ROLES = (("org.apache.spark.deploy.SparkSubmit", "spark_jvm"),
             ("CoarseGrainedExecutorBackend", "executor_jvms"),
             ("org.apache.spark.deploy.", "cluster_daemons"),
             ("deploy/spark/main.py", "cluster_driver_python"), ("pyspark", "python_workers"),
             ("kafka.Kafka", "broker"), ("streaming.loadgen produce", "load_generator"),
             ("streaming.loadgen consume", "reader"))
    # What the peaks are reported as, in the order `sample` measures them.
    PEAKS = ("driver_rss_peak_mb", "driver_jvm_rss_peak_mb", "driver_python_rss_peak_mb",
             "python_workers_pss_peak_mb")

    def __init__(self):
        super().__init__(daemon=True)
        self.peaks = [0] * len(self.PEAKS)
        self.window = [0] * len(self.PEAKS)    # peaks since the last `window_peaks`
        self._cpu: dict[int, tuple[str, float]] = {}
        # The sampling's own CPU (reading every child's memory maps for its PSS), which would
        # otherwise count as the driver's: reported apart as "bench_sampler".
        self._sampler_cpu = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @classmethod
    def role(cls, cmdline: str) -> str | None:
        for needle, role in cls.ROLES:
            if needle in cmdline:
                return role
        return None

    def run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        began = time.thread_time()
        try:
            self._sample()
        finally:
            with self._lock:
                self._sampler_cpu += time.thread_time() - began

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        python, jvm, workers, cpu = me.memory_info().rss, 0, 0, {}
        times = me.cpu_times()
        cpu[me.pid] = ("bench_python", times.user + times.system)
        children = []
        for child in me.children(recursive=True):
            try:
                children.append((child, self.role(" ".join(child.cmdline())), child.ppid()))
            except psutil.Error:
                continue
        jvms = {child.pid for child, role, _ in children if role == "spark_jvm"}
        for child, role, parent in children:
            if role is None or (role == "spark_jvm" and parent in jvms):
                continue
            try:
                memory = (child.memory_full_info().pss if role == "python_workers"
                          else child.memory_info().rss)
                times = child.cpu_times()
            except psutil.Error:
                continue
            cpu[child.pid] = (role, times.user + times.system)
            if role == "spark_jvm":
                jvm += memory
            elif role == "python_workers":
                workers += memory
        now = (jvm + python, jvm, python, workers)
        with self._lock:
            self._cpu.update(cpu)
            self.peaks = [max(a, b) for a, b in zip(self.peaks, now)]
            self.window = [max(a, b) for a, b in zip(self.window, now)]

    def _report(self, peaks: list[int]) -> dict:
        return {name: round(value / 2**20) for name, value in zip(self.PEAKS, peaks)}

    def window_peaks(self) -> dict:
        """Peaks since the last call (a scenario's own), and start a new window."""
        self.sample()
        with self._lock:
            window, self.window = self.window, [0] * len(self.PEAKS)
        return self._report(window)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far per role (processes that ended count with their last
        sample)."""
        self.sample()
        totals: dict[str, float] = {}
        with self._lock:
            for role, seconds in self._cpu.values():
                totals[role] = totals.get(role, 0.0) + seconds
            totals["bench_python"] = totals.get("bench_python", 0.0) - self._sampler_cpu
            totals["bench_sampler"] = self._sampler_cpu
        return totals

    def stop(self) -> dict:
        self._stop.set()
        with self._lock:
            return self._report(self.peaks)


def driver_cost(figures: dict) -> dict:
    """The driver's Python CPU per delivered message (µs): the bench's own process, which runs
    the job's driver in-process and also reads the progress, less its memory sampling; in the
    cluster scenario the submitted driver's Python process."""
    delivered = figures.get("delivered")
    cpu = figures.get("cpu_s", {})
    python_s = cpu.get("cluster_driver_python", cpu.get("bench_python"))
    if not delivered or python_s is None:
        return {}
    return {"driver_python_cpu_us_per_msg": round(python_s * 1e6 / delivered, 1)}


def cpu_used(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """CPU seconds per role between two readings, and the share of the machine they took."""
    used = {role: round(after.get(role, 0.0) - before.get(role, 0.0), 1) for role in after}
    cores = os.cpu_count() or 1
    total = sum(used.values())
    return {"cpu_s": used, "cpu_total_s": round(total, 1),
            "machine_busy": round(total / (wall_s * cores), 2) if wall_s > 0 else None}


def _batches(query, after: int) -> dict:
    progress = [p for p in query.recentProgress if p["batchId"] > after]
    took = np.array([p["durationMs"].get("triggerExecution", 0) for p in progress])
    rows = sum(p["numInputRows"] for p in progress)
    return {"batches": len(progress), "batch_p50_ms": percentile(took, 50),
            "batch_p90_ms": percentile(took, 90), "batch_max_ms": percentile(took, 100),
            "rows_per_batch_p50": percentile(np.array([p["numInputRows"] for p in progress]), 50),
            "input_rows": rows}


def _start_ms(progress: dict) -> float:
    """When a batch began, from its progress report (epoch ms)."""
    from datetime import datetime

    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000


def _timeline(query, after: int, summaries: list) -> list[dict]:
    """Each batch after `after`: its start, duration, input rows, Spark's own phases and the
    job's steps (foreachBatch), for finding what makes the long batches long."""
    steps = {s.batch_id: s.timings for s in summaries}
    fired = {s.batch_id: s.by_kind.get("deliver", 0) for s in summaries}
    return [{"batch": p["batchId"], "start_ms": int(_start_ms(p)),
             "ms": p["durationMs"].get("triggerExecution", 0), "rows": p["numInputRows"],
             "fired": fired.get(p["batchId"], 0),
             "phases_ms": {k: v for k, v in p["durationMs"].items() if k != "triggerExecution"},
             "steps_s": steps.get(p["batchId"], {}), "state": _state_figures(p)}
            for p in query.recentProgress if p["batchId"] > after]


STATE_FIGURES = ("numRowsUpdated", "allUpdatesTimeMs", "numRowsRemoved", "allRemovalsTimeMs",
                 "commitTimeMs")


def _state_figures(progress: dict) -> dict:
    """The wheel's state store in one batch, from its progress report: rows updated and
    removed and the time their puts and removes took, the commit's time, and RocksDB's own
    figures (Spark's `rocksdb*` custom metrics: bytes read and written, get and put latency…)."""
    operators = progress.get("stateOperators") or []
    if not operators:
        return {}
    wheel = operators[0]
    figures = {k: wheel.get(k) for k in STATE_FIGURES}
    figures.update({k: v for k, v in (wheel.get("customMetrics") or {}).items()
                    if k.startswith("rocksdb")})
    return figures


def _processing_rate(query, after: int, until_ms: int | None) -> dict:
    """Rows per second of batch time over the batches that started before the last delivery:
    the pipe's own throughput, without the query's start-up or the reader's polling."""
    if until_ms is None:
        return {}
    # The batch that made the last delivery reports its progress when it commits.
    deadline = time.time() + 60
    while time.time() < deadline and not any(
            _start_ms(p) + p["durationMs"].get("triggerExecution", 0) >= until_ms
            for p in query.recentProgress):
        time.sleep(0.5)
    took = rows = 0
    for p in query.recentProgress:
        if p["batchId"] > after and _start_ms(p) <= until_ms:
            took += p["durationMs"].get("triggerExecution", 0)
            rows += p["numInputRows"]
    return {"batch_rows": rows, "batch_seconds": round(took / 1000, 2),
            "processing_msg_s": round(rows / (took / 1000), 1) if took else None}


def _last_delivery_ms(figures: dict) -> int | None:
    due, late = figures["_series"]
    return int((due + late).max()) if len(due) else None


def _steps(summaries) -> dict:
    """Median seconds of each step of the delivery batches (wheel, kafka, ledger, …)."""
    names = {name for summary in summaries for name in summary.timings}
    return {name: round(float(np.median([s.timings[name] for s in summaries
                                         if name in s.timings])), 3) for name in sorted(names)}


def _ended_since(query, ms: int) -> bool:
    """Whether a batch of `query` reported as ended at or after `ms` (epoch ms)."""
    progress = query.lastProgress
    return bool(progress) and _start_ms(progress) + progress["durationMs"].get(
        "triggerExecution", 0) >= ms


def _last_batch(query) -> int:
    return query.lastProgress["batchId"] if query.lastProgress else -1


def _wait_for_line(proc, log: Path, line: str, timeout_s: float) -> None:
    """Until `proc`'s log holds `line`; its exit or the timeout first is an error."""
    deadline = time.monotonic() + timeout_s
    while line.encode() not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"the restart scenario's job exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the restart scenario's job did not start in {timeout_s:.0f} s; "
                               f"see {log}")
        time.sleep(0.5)


def stop_child(job, wait_s: float = 90) -> None:
    """A `delayq run` or `submit` child's clean stop (SIGTERM), its session killed past
    `wait_s`."""
    from streaming.process import kill_session

    if job is None or job.poll() is not None:
        return
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(wait_s)
    except subprocess.TimeoutExpired:
        kill_session(job)


def _topic(admin, prefix: str, partitions: int = 2) -> str:
    from streaming.admin import create_topic

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_topic(admin, name, partitions, {"message.timestamp.type": "LogAppendTime"})
    return name


def child_env(environ, overrides: dict) -> dict[str, str]:
    """The environment of a `delayq run` child with the settings of the bench's own job: the
    environment's DELAYQ_* values under the bench's overrides, so a setting given in the
    environment holds for the restart scenario's job as for the other scenarios."""
    return {**environ, **{f"DELAYQ_{k.upper()}": str(v) for k, v in overrides.items()}}


def _stamps(figures: dict) -> np.ndarray:
    """Each delivered message's first delivery time (broker timestamp, ms)."""
    due, late = figures["_series"]
    return due + late


def _outage_figures(held: dict, restarted_ms: float) -> dict:
    """An outage's backlog after the restart: when its first and last messages left, how
    fast it was caught up (first to last delivery), and how late it was."""
    stamps = _stamps(held)
    figures = {k: held[k] for k in ("messages", "delivered", "lost", "early", "duplicates",
                                    "lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms",
                                    "out_msg_s")}
    if len(stamps):
        figures.update(
            first_delivery_after_restart_s=round((stamps.min() - restarted_ms) / 1000, 1),
            all_delivered_after_restart_s=round((stamps.max() - restarted_ms) / 1000, 1),
            before_restart=int(np.sum(stamps < restarted_ms)))
    return figures


class Bench:
    def __init__(self, settings: Settings, spark, plan: Plan, work: Path,
                 overrides: dict | None = None, log=lambda line: print(line, flush=True)):
        from streaming.admin import admin_client

        self.settings, self.spark, self.plan, self.work = settings, spark, plan, work
        # The settings a `delayq run` child of the restart scenario needs, as DELAYQ_* values.
        self.overrides = overrides or {}
        self.admin = admin_client(settings)
        self.log = log
        self.job = None
        self.summaries: list = []   # every delivery batch's BatchSummary (step timings)

    # -- the raw pipe --------------------------------------------------------------------
    def _raw_query(self, intake: str, real: str, name: str):
        """The raw pipe: `intake` copied to `real` by a plain Spark Kafka query with the job's
        Kafka options, trigger and batch bound (no parse, no state, no hold)."""
        from pyspark.sql import functions as F

        from sinks.kafka import PRODUCER_OPTIONS
        from streaming.kafka_config import spark_options

        options = spark_options(self.settings)
        reader = (self.spark.readStream.format("kafka").options(**options)
                  .option("subscribe", intake).option("startingOffsets", "earliest")
                  .option("includeHeaders", "true"))
        if self.settings.max_offsets_per_trigger > 0:
            reader = reader.option("maxOffsetsPerTrigger", self.settings.max_offsets_per_trigger)
        return (reader.load()
                .select(F.lit(real).alias("topic"), "key", "value", "headers")
                .writeStream.format("kafka").options(**{**PRODUCER_OPTIONS, **options})
                .option("checkpointLocation", str(self.work / f"{name}-ckpt"))
                .trigger(processingTime="0 seconds").start())

    def raw(self) -> dict:
        intake, real = _topic(self.admin, "bench-raw-in", 1), _topic(self.admin, "bench-raw-out")
        load = Load(self.settings, self.work, real, "raw")
        load.start_reader(timeout_s=600)
        # Level 0: the raw pipe's due time is the append time itself.
        load.produce(intake, self.plan.drain, 0, self.plan.size, levels=(0,))
        query = self._raw_query(intake, real, "raw")
        try:
            figures = load.finish(self.plan.drain)
            figures.update(_processing_rate(query, -1, _last_delivery_ms(figures)))
        finally:
            query.stop()
        # The raw pipe has no due time: its "lateness" is the copy's delay after append.
        return figures

    def raw_steady(self) -> dict:
        """The raw pipe under the steady scenario's load (rate, seconds, warm-up, levels, one
        intake partition per level): its transit, from the intake's append to the copy's, is
        the least time any Spark micro-batch job on this host and trigger takes to read a
        message and write it again at that rate. A level's lateness in delayq can be no lower
        than that transit minus the level's delay, so this measures the floor under the
        steady scenario's lateness in the same run ("lateness" here is the transit)."""
        plan = self.plan
        partitions = max(1, *plan.levels)   # one per level, as the intake; level 0 too
        intake = _topic(self.admin, "bench-raw-steady-in", partitions)
        real = _topic(self.admin, "bench-raw-steady-out")
        load = Load(self.settings, self.work, real, "raw-steady")
        count = int(plan.rate * (plan.warmup_s + plan.seconds))
        load.start_reader(timeout_s=plan.warmup_s + plan.seconds + 600)
        query = self._raw_query(intake, real, "raw-steady")
        try:
            # The steady load's levels and partitions, each due at its append: a transit.
            produced = load.produce(intake, count, plan.rate, plan.size, levels=plan.levels,
                                    partitions=partitions, wait=False, no_delay=True)
            after = -1
            if plan.warmup_s:
                time.sleep(plan.warmup_s)
                after = _last_batch(query)
            done = load.wait_producer(produced)
            figures = load.finish(count)
            if plan.warmup_s:
                figures.update(after_warmup(figures, plan.warmup_s))
            figures.update(in_msg_s=done["rate"], **_batches(query, after))
            figures["_timeline"] = _timeline(query, after, [])
        finally:
            query.stop()
        return figures

    # -- delayq ------------------------------------------------------------------------------
    def start_job(self):
        from streaming.job import DelayJob

        self.job = DelayJob(self.settings, self.spark, checkpoint=str(self.work / "ckpt"),
                            on_batch=self.summaries.append)
        self.job.start()

    def drain(self) -> dict:
        real = _topic(self.admin, "bench-drain")
        load = Load(self.settings, self.work, real, "drain")
        from streaming.admin import ensure_topics

        ensure_topics(self.settings, self.admin)
        load.start_reader(timeout_s=900)
        load.produce(self.settings.intake_topic, self.plan.drain, self.plan.drain_rate,
                     self.plan.size, levels=(1,), partitions=len(self.settings.level_delays_ms))
        time.sleep(self.settings.level_delays_ms[0] / 1000 + 0.5)  # all overdue at the start
        first_summary = len(self.summaries)
        self.start_job()
        figures = load.finish(self.plan.drain)
        figures.update(_processing_rate(self.job.query, -1, _last_delivery_ms(figures)))
        figures["_timeline"] = _timeline(self.job.query, -1, self.summaries[first_summary:])
        return figures

    def _on_job(self, name: str) -> Load:
        """The running job (started if none) and a load for a fresh real topic."""
        if self.job is None:
            self.start_job()
        return Load(self.settings, self.work, _topic(self.admin, f"bench-{name}"), name)

    def steady(self) -> dict:
        return self._constant("steady", self.plan.rate, self.plan.seconds, self.plan.warmup_s)

    def _constant(self, name: str, rate: float, seconds: float, warmup_s: float = 0) -> dict:
        """`rate` msg/s for `warmup_s` + `seconds` over the plan's levels, each on time or how
        late; lateness and batch figures over the `seconds` after the warm-up."""
        load = self._on_job(name)
        count = int(rate * (warmup_s + seconds))
        longest = max(self.settings.level_delays_ms[lv - 1] for lv in self.plan.levels)
        load.start_reader(timeout_s=warmup_s + seconds + longest / 1000 + 600)
        after = _last_batch(self.job.query)
        first_summary = len(self.summaries)
        produced = load.produce(self.settings.intake_topic, count, rate, self.plan.size,
                                levels=self.plan.levels,
                                partitions=len(self.settings.level_delays_ms), wait=False)
        if warmup_s:
            time.sleep(warmup_s)
            after, first_summary = _last_batch(self.job.query), len(self.summaries)
        ledger_after = _last_batch(self.job.ledger_query) if self.job.ledger_query else -1
        done = load.wait_producer(produced)
        figures = load.finish(count)
        if warmup_s:
            figures.update(after_warmup(figures, warmup_s))
        figures.update(in_msg_s=done["rate"], **_batches(self.job.query, after))
        ledger = self.job.ledger_query
        if ledger is not None:   # the ledger query, over the same window
            figures["ledger_query"] = {**_batches(ledger, ledger_after), "timeline": [
                (p["batchId"], p["durationMs"].get("triggerExecution"),
                 p["durationMs"].get("addBatch"), p["numInputRows"])
                for p in ledger.recentProgress if p["batchId"] > ledger_after]}
        figures["step_p50_s"] = _steps(self.summaries[first_summary:])
        figures["_timeline"] = _timeline(self.job.query, after, self.summaries[first_summary:])
        return figures

    def burst(self) -> dict:
        load = self._on_job("burst")
        due = int((time.time() + self.plan.burst_lead_s) * 1000) // 1000 * 1000
        load.start_reader(timeout_s=self.plan.burst_lead_s + 900)
        after, first_summary = _last_batch(self.job.query), len(self.summaries)
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
        last = _last_delivery_ms(figures) or 0
        deadline = time.time() + 120
        while not _ended_since(self.job.query, last) and time.time() < deadline:
            time.sleep(0.5)
        figures["_timeline"] = _timeline(self.job.query, after, self.summaries[first_summary:])
        # The batches that released the burst from the wheel: when each began and ended,
        # against the due time (negative: before it), and how many it released.
        figures["fired"] = [
            {"batch": b["batch"], "messages": b["fired"], "start_s": round((b["start_ms"] - due) / 1000, 1),
             "end_s": round((b["start_ms"] + b["ms"] - due) / 1000, 1)}
            for b in figures["_timeline"] if b["fired"] >= self.plan.burst // 100]
        return figures

    def backlog(self) -> dict:
        """A large pending backlog: timers due over 2 h … 30 days (random bodies), taken in
        while a near load runs before and after it. Figures: the near load's lateness with
        the backlog pending (and without, as `without_backlog`, the same run), how fast the
        backlog was taken in, the bytes it keeps on disk, the memory peaks meanwhile."""
        if self.job is None:
            # A young JVM would make the load before the backlog the slower one: warm it first.
            self._constant("backlog-warm", self.plan.backlog_rate, self.plan.backlog_seconds)
        before = self._constant("backlog-before", self.plan.backlog_rate, self.plan.backlog_seconds)
        cold0 = sum(s.count("cold") for s in self.summaries)
        far = Load(self.settings, self.work, _topic(self.admin, "bench-far"), "backlog-far")
        now_ms = int(time.time() * 1000)
        hour, day = 3_600_000, 86_400_000
        t0 = time.time()
        producer = far.produce(self.settings.intake_topic, self.plan.backlog, 0, self.plan.size,
                               deliver_at_ms=now_ms + 2 * hour,
                               deliver_spread_ms=30 * day - 3 * hour, random_bodies=True,
                               partitions=len(self.settings.level_delays_ms), wait=False)
        far.wait_producer(producer)
        produce_s = time.time() - t0
        # Taken in: every backlog message written to the cold tier (never due in the run).
        deadline = time.time() + 600 + self.plan.backlog / 1_000
        parked = 0
        while time.time() < deadline:
            parked = sum(s.count("cold") for s in self.summaries) - cold0
            if parked >= self.plan.backlog:
                break
            time.sleep(1)
        taken_s = time.time() - t0
        after = self._constant("backlog-after", self.plan.backlog_rate, self.plan.backlog_seconds)
        cold_rows = self.spark.read.format("delta").load(str(self.settings.cold_path)).count()
        cold_bytes = du(Path(self.settings.cold_path))
        figures = dict(after)
        figures.update(
            lost=before["lost"] + after["lost"], early=before["early"] + after["early"],
            backlog=self.plan.backlog, parked=parked, cold_rows=cold_rows,
            not_parked=max(0, self.plan.backlog - cold_rows),
            produce_s=round(produce_s, 1), taken_in_s=round(taken_s, 1),
            taken_in_msg_s=round(parked / taken_s, 1) if taken_s else None,
            cold_tier_bytes=cold_bytes,
            cold_bytes_per_message=round(cold_bytes / max(1, cold_rows), 1),
            wheel_state_bytes=du(self.work / "ckpt" / "state"),
            without_backlog=_public(before))
        for what in ("lateness_p50_ms", "lateness_p99_ms", "batch_p50_ms"):
            if before.get(what) and after.get(what):
                figures[what.replace("_ms", "_ratio")] = round(after[what] / before[what], 3)
        return figures

    def restart(self) -> dict:
        """A `delayq run` child killed with SIGKILL while level-2 messages are pending, and
        started again after `restart_down_s` (at once by default): seconds from the restart to
        its first delivery. With `restart_backlog`, that many level-1 messages for the same
        real topic come in while it is down (an outage's backlog): figures under `outage`."""
        if self.job is not None:
            self.job.stop()
            self.job = None
        plan = self.plan
        real = _topic(self.admin, "bench-restart")
        load = Load(self.settings, self.work, real, "restart")
        from streaming.process import free_ports, kill_session

        # A job of its own: its own intake and data folder (the checkpoint guard rightly
        # refuses a fresh checkpoint on an intake another run has read).
        intake = f"{self.settings.intake_topic}-restart"
        env = child_env(os.environ, self.overrides)
        env.update(DELAYQ_METRICS_PORT=str(free_ports(1)[0]), DELAYQ_INTAKE_TOPIC=intake,
                   DELAYQ_DLQ_TOPIC=f"{intake}.DLQ",
                   DELAYQ_DATA_DIR=str(self.work / "restart-data"))
        logfile = open(self.work / "restart-job.log", "ab")

        def run():
            # A session of its own, so the kill takes the whole job, its Spark JVM and Python
            # workers with it, as a lost pod or machine would.
            return subprocess.Popen([sys.executable, "-m", "streaming.cli", "run"], env=env,
                                    cwd=PROJECT, stdout=logfile, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        # The load runs 20 s before the kill, through the downtime, and 12 s after the restart.
        count = int(plan.restart_rate * (32 + plan.restart_down_s))
        load.start_reader(timeout_s=600 + plan.restart_down_s, count=count)
        # The outage's backlog: the same real topic (one the killed run delivered to), its own
        # sequence numbers after the load's.
        outage = (Load(self.settings, self.work, real, "restart-outage", seq_base=count)
                  if plan.restart_backlog else None)
        if outage:
            outage.start_reader(timeout_s=900 + plan.restart_down_s, count=plan.restart_backlog)
        job = run()
        # Up and delivering before the kill: its first batch done ("delayq started in", which
        # `delayq run` prints then) and 20 s of the load behind it. A fixed wait from the
        # intake's creation and 8 s of load let the kill land while a slow host's job was
        # still in its first batches (start-up 25-33 s that day), with none of its messages
        # fired ahead yet: the scenario measured a job killed during its start.
        _wait_for_line(job, self.work / "restart-job.log", STARTED, timeout_s=300)
        producer = load.produce(intake, count, plan.restart_rate,
                                plan.size, levels=(2,),
                                partitions=len(self.settings.level_delays_ms), wait=False)
        time.sleep(20)
        kill_session(job)
        killed = time.time()
        if outage:
            outage.produce(intake, plan.restart_backlog, 0, plan.size, levels=(1,),
                           partitions=len(self.settings.level_delays_ms))
        time.sleep(max(0.0, killed + plan.restart_down_s - time.time()))
        restarted = time.time()
        job = run()
        if job.poll() is not None:
            raise RuntimeError(f"the restarted job exited; see {self.work / 'restart-job.log'}")
        load.wait_producer(producer)
        figures = load.finish(count)
        held = outage.finish(plan.restart_backlog) if outage else None
        stop_child(job, 60)
        restarted_ms = restarted * 1000
        figures["down_s"] = round(restarted - killed, 1)
        stamps = _stamps(figures)
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
                            (self.work / "restart-job.log").read_bytes())
        if len(starts) >= 2:
            figures["started_s"], figures["restarted_s"] = float(starts[-2]), float(starts[-1])
        if held is not None:
            figures["outage"] = _outage_figures(held, restarted_ms)
            for what in ("lost", "early", "duplicates"):
                figures[what] += held[what]
        return figures

    def first_minute(self) -> dict:
        from streaming import bench_start

        if self.job is not None:   # the cores are the fresh job's now
            self.job.stop()
            self.job = None
        return bench_start.run(self)

    def cluster(self) -> dict:
        from streaming import bench_cluster

        if self.job is not None:   # the 2 cores are the cluster's now
            self.job.stop()
            self.job = None
        return bench_cluster.run(self)

    def run(self) -> Result:
        machine = {"cores": os.cpu_count(), "spark_master": self.settings.spark_master,
                   "shuffle_partitions": self.settings.spark_shuffle_partitions,
                   "max_offsets_per_trigger": self.settings.max_offsets_per_trigger,
                   "ledger": self.settings.ledger,
                   "wheel_operator": self.settings.wheel_operator, "cpu_probe_ms": {"before": cpu_probe_ms()}}
        result = Result(plan=self.plan.__dict__.copy(), machine=machine)
        memory = MemoryPeaks()
        memory.start()
        try:
            for name in self.plan.scenarios:
                self.log(f"bench: {name} …")
                t0, cpu0 = time.time(), memory.cpu_seconds()
                memory.window_peaks()
                figures = getattr(self, name.replace("-", "_"))()
                figures["wall_s"] = round(time.time() - t0, 1)
                figures.update(memory.window_peaks())
                figures.update(cpu_used(cpu0, memory.cpu_seconds(), figures["wall_s"]))
                figures.update(driver_cost(figures))
                result.scenarios[name] = figures
                self.log(f"bench: {name}: " + json.dumps(_public(figures)))
        finally:
            if self.job is not None:
                self.job.stop()
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


def lateness_floor(pipe: dict | None, levels: tuple[int, ...],
                   delays_ms: tuple[int, ...]) -> dict[str, int]:
    """Per level, the p99 lateness a job would have if it read and wrote each message as soon
    as the raw pipe does under the same load (`raw-steady`): the pipe's p99 transit minus
    the level's delay (a constant, so the percentile moves with it), never below 0. A job
    that does more per batch than the pipe cannot be lower."""
    p99 = (pipe or {}).get("lateness_p99_ms")
    if p99 is None:
        return {}
    # Level 0 is delivered at once: no delay to take off.
    return {str(lv): max(0, p99 - (delays_ms[lv - 1] if lv > 0 else 0))
            for lv in sorted(set(levels))}


def cpu_probe_ms(loops: int = 3_000_000, tries: int = 3) -> float:
    """How fast this host runs one core's work now: the best of `tries` timings of a fixed
    Python loop, in ms. This host's speed varies from day to day and within a run (every
    process's CPU seconds for the same work, the load generator's too, were 1.5 to 2 times
    their usual on some days), so a run's figures compare with another's only at a similar
    probe; the ratios measured within a run do not depend on it."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        total = 0
        for i in range(loops):
            total += i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def _public(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if not k.startswith("_")}


def write(result: Result, json_path: Path, plot_path: Path | None) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    body = {"plan": result.plan, "machine": result.machine,
            "scenarios": {k: _public(v) for k, v in result.scenarios.items()},
            # Per batch, for the scenarios at a constant rate (not printed: long).
            "timelines": {k: v["_timeline"] for k, v in result.scenarios.items()
                          if "_timeline" in v}}
    json_path.write_text(json.dumps(body, indent=2) + "\n")
    if plot_path is None:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in ("raw-steady", "steady", "burst", "backlog", "restart")
             if n in result.scenarios]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 3.2 * len(shown)), squeeze=False)
    for ax, name in zip(axes[:, 0], shown):
        due, late = result.scenarios[name]["_series"]
        if not len(due):
            continue
        if len(due) > 40_000:
            pick = np.random.default_rng(0).choice(len(due), 40_000, replace=False)
            due, late = due[pick], late[pick]
        ax.scatter((due - due.min()) / 1000, late, s=1, alpha=0.4)
        # The raw pipe keeps nothing: its "lateness" is the transit from append to copy.
        ax.set_title(f"{name}: {'transit' if name == 'raw-steady' else 'lateness'} by due time")
        ax.set_xlabel("due time (s from the first)")
        ax.set_ylabel("lateness (ms)")
        ax.axhline(0, color="red", linewidth=0.8)
    fig.tight_layout()
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=90)
    plt.close(fig)


def tidy(work: Path, keep: bool, problems: list[str] | None) -> str:
    """What becomes of a run's folder (its broker's log, the job's checkpoint and tables, the
    sent and read arrays: gigabytes for the default scenarios). Removed after a clean run,
    unless asked to keep it; kept when the run found lost or early messages, or did not finish
    (problems None), since its arrays and topics are what shows which ones. Returns the line
    to print."""
    if keep:
        return f"bench: kept the run's data in {work}"
    if problems is None or problems:
        why = "the run did not finish" if problems is None else "lost or early messages"
        return f"bench: kept the run's data in {work} ({why}); remove it when done"
    shutil.rmtree(work, ignore_errors=True)
    if work.exists():
        return f"bench: could not remove all of {work}"
    return f"bench: removed the run's data ({work}); --keep-data keeps it"


def main(overrides: dict, plan: Plan, out: Path | None, plot: Path | None,
         keep_data: bool = False) -> int:
    """The CLI entry: a broker of its own (on free ports) unless Kafka is configured, a Spark
    session, the scenarios; prints the figures, writes them; 1 on early or lost. The run's
    folder under data_dir is removed after a clean run (`tidy`); the result is written beside
    it unless `out` says where."""
    import tempfile

    from conf import load_settings
    from streaming import broker
    from streaming.process import free_ports
    from streaming.session import build_session

    base = load_settings(**overrides)
    base.data_path.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=base.data_path))
    out = out or work.with_suffix(".json")
    tag = uuid.uuid4().hex[:6]
    overrides = {**overrides, "data_dir": str(work / "data"),
                 "intake_topic": f"bench-intake-{tag}", "dlq_topic": f"bench-intake-{tag}.DLQ"}
    spec = spark = None
    problems = None
    if base.embedded:
        port, controller = free_ports(2)
        spec = broker.BrokerSpec(home=work / "kafka", jars=base.jars_path / "kafka",
                                 port=port, controller_port=controller, heap="1g")
        broker.start(spec)
        overrides["bootstrap_servers"] = spec.bootstrap
    try:
        settings = load_settings(**overrides)
        spark = build_session(settings)
        result = Bench(settings, spark, plan, work, overrides).run()
        write(result, out, plot or out.with_suffix(".png"))
        print(json.dumps({"machine": result.machine,
                          "scenarios": {k: _public(v) for k, v in result.scenarios.items()}},
                         indent=2))
        print(f"bench: wrote {out} and {plot or out.with_suffix('.png')}")
        problems = result.problems()
        for line in problems:
            print(f"bench: FAILED: {line}", file=sys.stderr)
        return 1 if problems else 0
    finally:
        try:
            # Spark first: its state store maintenance still writes the checkpoint's snapshots
            # after the query stops, and would put files back into the folder being removed.
            if spark is not None:
                spark.stop()
        finally:
            if spec is not None:
                broker.stop(spec)
            print(tidy(work, keep_data, problems))
