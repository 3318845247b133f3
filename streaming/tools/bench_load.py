"""The bench's load and child processes: the load generator and reader (streaming/tools/loadgen.py),
the memory and CPU sampler, `delayq run` children and their stop."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from conf.settings import Settings
from streaming.tools.bench_figures import join
from streaming.kafka.config import librdkafka_config

PROJECT = Path(__file__).resolve().parents[2]

class Load:
    """One load generator and one reader for a real topic, as child processes. Loads that
    share a real topic each take their own range of sequence numbers: `seq_base` is this
    one's first, and its reader is told how many it has (`count`) so it skips the others'."""

    def __init__(self, settings: Settings, work: Path, real: str, name: str, seq_base: int = 0):
        self.settings, self.real, self.seq_base = settings, real, seq_base
        self.out = str(work / name)
        security = {k: v for k, v in librdkafka_config(settings).items() if k != "logger"}
        self.env = {**os.environ, "DELAYQ_BENCH_SECURITY": json.dumps(security)}
        self.reader = None

    def start_reader(self, timeout_s: float, idle_s: float = 120.0, count: int = 0) -> None:
        self.reader = subprocess.Popen(
            [sys.executable, "-m", "streaming.tools.loadgen", "consume",
             "--bootstrap", self.settings.bootstrap, "--topic", self.real,
             "--out", self.out + "-read.npz", "--timeout", str(timeout_s), "--idle", str(idle_s),
             "--seq-base", str(self.seq_base), "--seq-count", str(count)],
            env=self.env, cwd=PROJECT)

    def produce(self, intake: str, count: int, rate: float, size: int,
                levels: tuple[int, ...] = (1,), deliver_at_ms: int = 0, partitions: int = 1,
                wait: bool = True, deliver_spread_ms: int = 0, random_bodies: bool = False,
                no_delay: bool = False, delay_spread_ms: int = 0, timer_mix_ms: int = 0):
        """Sends `count` messages at `rate` (0: at once); each is due its level's delay after
        its append, or at its append with `no_delay` (the raw pipe, which keeps nothing), or
        with `delay_spread_ms` a timer delay drawn uniformly below it, or with `timer_mix_ms`
        a timer of every header form (loadgen.py TimerMix)."""
        delays = ",".join("0" if no_delay else str(d) for d in self.settings.level_delays_ms)
        proc = subprocess.Popen(
            [sys.executable, "-m", "streaming.tools.loadgen", "produce",
             "--bootstrap", self.settings.bootstrap, "--intake", intake, "--real", self.real,
             "--count", str(count), "--rate", str(rate), "--size", str(size),
             "--levels", ",".join(map(str, levels)), "--delays", delays,
             "--deliver-at-ms", str(deliver_at_ms), "--partitions", str(partitions),
             "--deliver-spread-ms", str(deliver_spread_ms),
             "--timer-delay-spread-ms", str(delay_spread_ms),
             "--timer-mix-ms", str(timer_mix_ms),
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
        return join(sent["append"], sent["due"], read["seq"], read["ts"], sent["level"],
                    read["seen"] if "seen" in read.files else None)


class MemoryPeaks(threading.Thread):
    """Peak memory of the driver (its JVM and its Python process, this one unless a child runs
    the job; together and each alone) and of the Python workers (together, and the largest
    alone: a dispatch task's worker holds its rows), and CPU seconds per role (driver JVM,
    Python workers, broker, load generator, reader, this process), sampled twice a second from
    /proc.

    The JVM and this process are measured by their resident set (RSS). The Python workers are
    forks of one daemon that share its pages, so they are measured by their proportional set
    (PSS: a page shared by n processes counts 1/n to each), which adds up to what they use
    together; their RSS would count the shared pages once per worker. A child of the JVM that
    still has the JVM's command line is a spawn that has not exec'd yet and shares the JVM's
    memory: it is not counted (counted, it doubled the JVM's peak in a backlog run)."""

    # First match wins: a JVM's class path names pyspark, and the cluster's driver JVM its
    # main.py. The cluster scenario's executors, Master and Workers, and its driver's Python.
    ROLES = (("org.apache.spark.deploy.SparkSubmit", "spark_jvm"),
             ("CoarseGrainedExecutorBackend", "executor_jvms"),
             ("org.apache.spark.deploy.", "cluster_daemons"),
             ("deploy/spark/main.py", "cluster_driver_python"),
             ("streaming.cli.main run", "job_driver_python"), ("pyspark", "python_workers"),
             ("kafka.Kafka", "broker"), ("streaming.tools.loadgen produce", "load_generator"),
             ("streaming.tools.loadgen consume", "reader"))
    # What the peaks are reported as, in the order `sample` measures them.
    PEAKS = ("driver_rss_peak_mb", "driver_jvm_rss_peak_mb", "driver_python_rss_peak_mb",
             "python_workers_pss_peak_mb", "python_worker_pss_peak_mb")

    def __init__(self):
        super().__init__(daemon=True)
        self.peaks = [0] * len(self.PEAKS)
        self.window = [0] * len(self.PEAKS)    # peaks since the last `window_peaks`
        self._cpu: dict[int, tuple[str, float]] = {}
        # The sampling's own CPU (reading every child's memory maps for its PSS), which would
        # otherwise count as the driver's: reported apart as "bench_sampler".
        self._sampler_cpu = 0.0
        # The bench's own analysis in this process (joining sends and deliveries, reading the
        # progress), which is not the driver's either: reported apart as "bench_analysis".
        self._analysis_cpu = 0.0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    @classmethod
    def role(cls, cmdline: str) -> str | None:
        for needle, role in cls.ROLES:
            if needle in cmdline:
                return role
        return None

    def run(self) -> None:
        while not self._halt.wait(0.5):
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
        # The driver's Python: this process, unless a `delayq run` or `submit` child is the job.
        python, own, jvm, workers, largest, cpu = 0, me.memory_info().rss, 0, 0, 0, {}
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
                workers, largest = workers + memory, max(largest, memory)
            elif role in ("job_driver_python", "cluster_driver_python"):   # a child's driver
                python += memory
        python = python or own
        now = (jvm + python, jvm, python, workers, largest)
        with self._lock:
            self._cpu.update(cpu)
            self.peaks = [max(a, b) for a, b in zip(self.peaks, now)]
            self.window = [max(a, b) for a, b in zip(self.window, now)]

    def _report(self, peaks: list[int]) -> dict:
        return {name: round(value / 2**20) for name, value in zip(self.PEAKS, peaks)}

    def exclude(self, thread_cpu_s: float) -> None:
        """CPU seconds the bench's analysis took (`time.thread_time` of its thread)."""
        with self._lock:
            self._analysis_cpu += thread_cpu_s

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
            totals["bench_python"] = (totals.get("bench_python", 0.0) - self._sampler_cpu
                                      - self._analysis_cpu)
            totals["bench_sampler"] = self._sampler_cpu
            totals["bench_analysis"] = self._analysis_cpu
        return totals

    def stop(self) -> dict:
        self._halt.set()
        with self._lock:
            return self._report(self.peaks)


def wait_for_line(proc, log: Path, line: str, timeout_s: float) -> None:
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
    from streaming.tools.process import kill_session

    if job is None or job.poll() is not None:
        return
    job.send_signal(signal.SIGTERM)
    try:
        job.wait(wait_s)
    except subprocess.TimeoutExpired:
        kill_session(job)


def fresh_topic(admin, prefix: str, partitions: int = 2) -> str:
    from streaming.kafka.admin import create_topic

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_topic(admin, name, partitions, {"message.timestamp.type": "LogAppendTime"})
    return name


def child_env(environ, overrides: dict) -> dict[str, str]:
    """The environment of a `delayq run` child with the settings of the bench's own job: the
    environment's DELAYQ_* values under the bench's overrides, so a setting given in the
    environment holds for the restart scenario's job as for the other scenarios."""
    return {**environ, **{f"DELAYQ_{k.upper()}": str(v) for k, v in overrides.items()}}


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
