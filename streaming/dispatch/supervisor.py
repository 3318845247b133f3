"""The dispatch stage's supervisor, in the driver: each ready partition runs as its own one-task
Spark job (task.py run_partition), restarted here with a back-off: Spark does not retry tasks in
`local[N]`, and a never-ending task's failures would add up to `spark.task.maxFailures`. A clean
stop writes a stop record for this run to every ready partition."""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from streaming.dispatch.rules import READY_STOP, DispatchConfig
from streaming.dispatch.task import run_partition

log = logging.getLogger(__name__)


def failure_reason(exc: Exception) -> str:
    """A failed task's reason in one line: the message of a delayq error the task raised (its
    Python traceback is inside Spark's error), else the first line of the error."""
    lines = str(exc).splitlines()
    said = [line.split(": ", 1)[1] for line in lines
            if line.startswith("state.errors.") and ": " in line]
    return said[-1] if said else (lines[0] if lines else repr(exc))


@dataclass(frozen=True)
class Supervision:
    """How the driver keeps the tasks running (streaming/stages.py supervision_of)."""

    liveness_timeout_s: float          # a task committing nothing this long is restarted
    kill_timeout_s: float              # its executor not reporting the cancel this long: replaced
    failure_window_s: float            # more than `max_failures` failures within it: give up
    max_failures: int
    restart_backoff_ms: tuple[int, ...]   # the wait before the first, second, ... restart


class Dispatcher:
    def __init__(self, spark, config: DispatchConfig, supervision: Supervision, on_commits=None):
        self.spark, self.config, self.supervision = spark, config, supervision
        self.partitions, self.run_id = config.ready_partitions, config.run_id
        self.failure: str | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reader = None   # the commits' reader (a consumer never subscribed)
        self._on_commits = on_commits   # called with `reports()` once per commit interval
        # The liveness check: each running task's last commit metadata, unchanged since when.
        self._beats: dict[int, tuple[str | None, float]] = {}
        # Tasks cancelled by it (stage, attempt, executor) not yet reported ended: partition, when.
        self._cancelled: dict[tuple[int, int, str], tuple[int, float]] = {}

    def start(self) -> "Dispatcher":
        for partition in range(self.partitions):
            thread = threading.Thread(target=self._supervise, args=(partition,),
                                      name=f"delayq-dispatch-{partition}", daemon=True)
            thread.start()
            self._threads.append(thread)
        threading.Thread(target=self._report, name="delayq-dispatch-reports", daemon=True).start()
        return self

    def _report(self) -> None:
        """Reports to `on_commits` and the liveness check every commit interval."""
        interval = self.config.offsets_interval_s
        while not self._stopping.wait(interval):
            try:
                reports = self.reports()
            except Exception as exc:   # noqa: BLE001 (a gauge's update never stops delivery)
                log.warning("could not read the dispatch tasks' commits: %s", exc)
                now = time.monotonic()   # unseen, a task gets its full time again
                self._beats = {p: (meta, now) for p, (meta, _) in self._beats.items()}
                continue
            try:
                self._reap()
            except Exception as exc:   # noqa: BLE001 (the next interval looks again)
                log.warning("could not look up the cancelled dispatch tasks: %s", exc)
            if self._on_commits is not None:
                try:
                    self._on_commits(*reports)
                except Exception as exc:   # noqa: BLE001 (likewise)
                    log.warning("could not report the dispatch tasks' commits: %s", exc)

    def _alive(self, partition: int, metadata: str | None) -> None:
        """A task whose commits stopped for `dispatch_liveness_timeout` (worker paused, executor
        cut off) has its job cancelled; its supervisor starts it again, fencing the old one."""
        if partition not in self._beats:
            return   # between two runs of the task
        now = time.monotonic()
        last, since = self._beats[partition]
        if metadata != last:
            self._beats[partition] = metadata, now
            return
        timeout_s = self.supervision.liveness_timeout_s
        if now - since > timeout_s and not self._stopping.is_set():
            log.warning("dispatch %d committed nothing for %.0f s (setting "
                        "dispatch_liveness_timeout); cancelling it, a new task takes over",
                        partition, now - since)
            self._beats[partition] = metadata, now
            try:   # where it runs, for `_reap`; the cancel goes out whatever this finds
                if self.spark.sparkContext.master.split("[")[0] != "local":
                    for task in self._running(partition):
                        self._cancelled.setdefault(task, (partition, now))
            finally:
                self.spark.sparkContext.cancelJobGroup(self._group(partition))

    def _running(self, partition: int) -> list[tuple[int, int, str]]:
        """(stage, stage attempt, executor id) of each running task of `partition`'s running
        jobs, from Spark's status store."""
        tracker = self.spark.sparkContext.statusTracker()
        found = []
        for job in tracker.getJobIdsForGroup(self._group(partition)):
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info is not None and info.status == "RUNNING" else ()):
                attempt = getattr(tracker.getStageInfo(stage), "currentAttemptId", 0)
                found += [(stage, attempt, executor) for executor in self._on(stage, attempt)]
        return found

    def _on(self, stage: int, attempt: int) -> list[str]:
        """The executors of the stage attempt's tasks that Spark's status store has as running
        (until their executor reports them ended)."""
        tasks = self.spark.sparkContext._jsc.sc().statusStore().taskList(stage, attempt, 100)
        return [task.executorId() for task in (tasks.apply(i) for i in range(tasks.size()))
                if task.status() == "RUNNING"]

    def _reap(self) -> None:
        """A cancelled task its executor has not reported ended within `kill_timeout_s`: the
        executor is taken as lost and Spark asked to kill and replace it (as its HeartbeatReceiver
        does after spark.network.timeout); no task is offered its slots (the task's and those of
        micro-batch tasks waiting on it) from then on, and they are freed once it is gone."""
        now = time.monotonic()
        running = {(stage, attempt, executor) for stage, attempt in
                   {task[:2] for task in self._cancelled} for executor in self._on(stage, attempt)}
        lost: dict[str, tuple[int, float]] = {}
        for task, (partition, since) in list(self._cancelled.items()):
            overdue = now - since > self.supervision.kill_timeout_s
            if task in running and overdue:
                lost[task[2]] = partition, now - since
            if task not in running or overdue:
                del self._cancelled[task]
        for executor, (partition, waited) in sorted(lost.items()):
            log.warning("dispatch %d's cancelled task still runs on executor %s %.0f s later "
                        "(setting dispatch_kill_timeout): taking that executor as lost; "
                        "asking Spark to kill and replace it", partition, executor, waited)
            self.spark.sparkContext._jsc.sc().killAndReplaceExecutor(executor)

    def reports(self) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
        """From the tasks' last commits' metadata (one request, whatever the rate): messages read
        and not yet finished, by level, and by ready partition each task's clock offset to the
        broker's in ms (Skew) and how late it reads its ring (ms past its next slot's time)."""
        if self._reader is None:
            self._reader = Consumer(self.config.consumer)
        held: dict[int, int] = {}
        clocks: dict[int, int] = {}
        rings: dict[int, int] = {}
        for got in self._reader.committed([TopicPartition(self.config.ready_topic, p)
                                           for p in range(self.partitions)], timeout=10):
            self._alive(got.partition, got.metadata)
            meta = json.loads(got.metadata) if got.metadata else {}
            for level, n in meta.get("held", {}).items():
                held[int(level)] = held.get(int(level), 0) + n
            if meta.get("clock_ms") is not None:
                clocks[got.partition] = meta["clock_ms"]
            if meta.get("ring_lag_ms") is not None:
                rings[got.partition] = meta["ring_lag_ms"]
        return held, clocks, rings

    def _group(self, partition: int) -> str:
        return f"delayq-dispatch-{self.config.ready_topic}-{partition}"

    def _supervise(self, partition: int) -> None:
        context = self.spark.sparkContext
        config = self.config
        failures: deque[float] = deque()
        window_s = self.supervision.failure_window_s
        backoff_ms = self.supervision.restart_backoff_ms
        while not self._stopping.is_set():
            context.setJobGroup(self._group(partition),
                                f"delayq: dispatch of {self.config.ready_topic} partition "
                                f"{partition}", interruptOnCancel=True)
            self._beats[partition] = None, time.monotonic()
            try:
                [done] = (context.parallelize([partition], 1)
                          .mapPartitions(lambda parts: run_partition(config, next(iter(parts))))
                          .collect())
                log.info("dispatch %d ended: %d sent, %d dead-lettered, %d skipped as already "
                         "in the ledger", partition, done["sent"], done["dead"], done["skipped"])
                if self._stopping.is_set():
                    return
            except Exception as exc:   # noqa: BLE001 (the task's failure, whatever it was)
                if self._stopping.is_set():
                    return
                now = time.monotonic()
                failures.append(now)
                while failures and now - failures[0] > window_s:
                    failures.popleft()
                if len(failures) > self.supervision.max_failures:
                    self.failure = (f"dispatch of ready partition {partition} failed "
                                    f"{len(failures)} times in {window_s:.0f} s; last: "
                                    f"{failure_reason(exc)}")
                    log.error("%s; giving up (setting dispatch_max_failures)", self.failure)
                    return
                wait = backoff_ms[min(len(failures), len(backoff_ms)) - 1] / 1000
                log.warning("dispatch %d failed (%s); starting it again in %.0f s from its "
                            "committed offset", partition, failure_reason(exc), wait)
                self.restarts += 1
                self._stopping.wait(wait)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask every task to end (a stop record per ready partition), wait up to `timeout_s`,
        then cancel the jobs of those that did not."""
        self._stopping.set()
        producer = Producer({k: v for k, v in self.config.producer.items()
                             if k != "topic.metadata.propagation.max.ms"})
        for partition in range(self.partitions):
            producer.produce(self.config.ready_topic, value=self.run_id.encode(),
                             partition=partition, headers=[(READY_STOP, b"1")])
        producer.flush(30)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for partition, thread in enumerate(self._threads):
            if thread.is_alive():
                log.warning("dispatch %d did not end within %.0f s of the stop; cancelling it "
                            "(what it sent after its last commit is sent again after the restart)",
                            partition, timeout_s)
                self.spark.sparkContext.cancelJobGroup(self._group(partition))
        for thread in self._threads:
            thread.join(10)
        if self._reader is not None:
            self._reader.close()
