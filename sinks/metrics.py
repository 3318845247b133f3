"""Every Prometheus metric of the service, built in one place on an injected registry (DESIGN.md
section 7: names are contract), fed by the queries' batch summaries and Spark's progress reports."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from sinks.base import BatchSummary

# Lateness is what the service is judged by, so its buckets are fine.
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
                    20.0, 30.0, 60.0)
BATCH_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


class LatenessHistogram(Collector):
    """A histogram fed with per-batch bucket counts (the ledger query counts each batch)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]):
        self.name, self.documentation, self.buckets = name, documentation, buckets
        self.counts = [0] * (len(buckets) + 1)  # cumulative ≤ bucket, then +Inf
        self.sum = 0.0
        # The ledger query adds while the scrape thread collects: a scrape sees a batch whole.
        self._lock = threading.Lock()

    def add(self, cumulative: list[int], total: int, seconds_sum: float) -> None:
        with self._lock:
            for i, n in enumerate(cumulative):
                self.counts[i] += n
            self.counts[-1] += total
            self.sum += seconds_sum

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation)
        bounds = [str(b) for b in self.buckets] + ["+Inf"]
        with self._lock:
            counts, total = list(self.counts), self.sum
        family.add_metric([], list(zip(bounds, counts)), total)
        yield family


class Metrics:
    def __init__(self, registry: CollectorRegistry, *, version: str, spark_version: str):
        self.registry = registry
        r = dict(registry=registry)
        self.received = Counter("delayq_messages_received", "Intake messages taken in, by delay "
                                "level (0: immediate, -1: timer).", ["level"], **r)
        self.delivered = Counter("delayq_messages_delivered",
                                 "Messages sent to their real topic, by level.", ["level"], **r)
        self.dead = Counter("delayq_messages_dead_lettered",
                            "Messages sent to the dead-letter topic, by reason.", ["reason"], **r)
        self.cancelled = Counter("delayq_messages_cancelled",
                                 "Pending messages dropped by a cancel.", **r)
        self.cancel_misses = Counter("delayq_cancel_misses", "Cancels of messages not pending "
                                     "(already delivered or unknown).", **r)
        self.pending = Gauge("delayq_pending_messages", "Messages not yet delivered, by level: in "
                             "the wheel, and read by a dispatch task and not yet sent.",
                             ["level"], **r)
        self._in_wheel: dict[str, float] = {}      # level → held in the wheel's state
        self._in_dispatch: dict[str, float] = {}   # level → read by a dispatch task, not done
        self._pending_lock = threading.Lock()   # the batches' thread and the dispatch reporter
        self.clock_offset = Gauge("delayq_dispatch_clock_offset_seconds",
                                  "A dispatch task's host clock minus the broker's, at most (as "
                                  "measured on the ledger topic), by ready partition.",
                                  ["partition"], **r)
        self.ring_lag = Gauge("delayq_ring_lag_seconds", "How long past its time a dispatch "
                              "task's next ring slot waits to be read, by ready partition.",
                              ["partition"], **r)
        self.lateness = LatenessHistogram("delayq_delivery_lateness_seconds",
                                          "Delivery time minus due time.", LATENESS_BUCKETS)
        registry.register(self.lateness)
        self._progress(r, version, spark_version)

    def _progress(self, r: dict, version: str, spark_version: str) -> None:
        """The metrics read from Spark's progress reports, the intake's retention and the build."""
        self.watermark_lag = Gauge("delayq_watermark_lag_seconds",
                                   "Wall clock minus the job's event-time watermark.", **r)
        self.batch_duration = Histogram("delayq_batch_duration_seconds",
                                        "Duration of a micro-batch.", buckets=BATCH_BUCKETS, **r)
        self.offsets_behind = Gauge("delayq_intake_offsets_behind",
                                    "Intake records written but not yet read by the job.", **r)
        self.delay_offset = Gauge("delayq_delay_offset", "Next intake offset of each level's "
                                  "partition (RocketMQ's delayOffset).", ["level"], **r)
        Gauge("delayq_build_info", "Build information.", ["version", "spark_version"],
              **r).labels(version=version, spark_version=spark_version).set(1)
        self.retention_headroom = Gauge(
            "delayq_intake_retention_headroom_seconds",
            "How long the job may still be down or behind before the intake's retention deletes "
            "a pending message's record: retention.ms, less the longest wait of a held reference "
            "(near_horizon + cold_bucket + clock_tolerance), less the watermark lag.", **r)
        self._retention_s: tuple[float, float] | None = None   # (retention, longest wait)
        self.last_batch_ms = Gauge("delayq_last_batch_timestamp_seconds",
                                   "When the last micro-batch finished.", **r)

    def set_retention(self, retention_ms: int, wait_ms: int) -> None:
        """The intake's retention.ms (-1: for ever) and the longest a reference waits."""
        retention = float("inf") if retention_ms < 0 else retention_ms / 1000
        self._retention_s = (retention, wait_ms / 1000)
        self.retention_headroom.set(retention - wait_ms / 1000)

    def add_pending(self, by_level: dict[int, int]) -> None:
        """Messages the wheel's state gained (lost, when negative) by level: a batch's deltas,
        or at the start those pending as of the last committed batch."""
        with self._pending_lock:
            for level, n in by_level.items():
                level = str(level)
                self._in_wheel[level] = self._in_wheel.get(level, 0) + n
                self.pending.labels(level=level).set(
                    self._in_wheel[level] + self._in_dispatch.get(level, 0))

    def set_dispatch(self, held_by_level: dict[int, int], clock_ms: dict[int, int],
                     ring_lag_ms: dict[int, int] | None = None) -> None:
        """What the dispatch tasks' last commits report (streaming/dispatch/supervisor.py): the
        messages they hold, by level, and each one's clock offset to the broker's."""
        with self._pending_lock:
            shown = set(self._in_dispatch) | {str(level) for level in held_by_level}
            self._in_dispatch = {str(level): n for level, n in held_by_level.items()}
            for level in shown:
                self.pending.labels(level=level).set(
                    self._in_wheel.get(level, 0) + self._in_dispatch.get(level, 0))
        for partition, ms in clock_ms.items():
            self.clock_offset.labels(partition=str(partition)).set(ms / 1000)
        for partition, ms in (ring_lag_ms or {}).items():
            self.ring_lag.labels(partition=str(partition)).set(ms / 1000)

    def observe_batch(self, summary: BatchSummary) -> None:
        for level, n in summary.received_by_level.items():
            self.received.labels(level=str(level)).inc(n)
        for reason, n in summary.dead_by_reason.items():
            self.dead.labels(reason=reason).inc(n)
        self.cancelled.inc(summary.count("cancelled"))
        self.cancel_misses.inc(summary.count("cancel_unknown"))
        self.add_pending(summary.pending_delta_by_level)
        for level, n in summary.delivered_by_level.items():
            self.delivered.labels(level=str(level)).inc(n)
        if summary.lateness is not None:
            self.lateness.add(*summary.lateness)

    def observe_progress(self, progress: dict, late_tolerance_ms: int, intake_topic: str,
                         now: float | None = None, heartbeats: int | None = None) -> None:
        """A batch's progress; `delayq_delay_offset` for every intake partition but `heartbeats`."""
        now = time.time() if now is None else now
        duration = progress.get("durationMs", {}).get("triggerExecution")
        if duration is not None:
            self.batch_duration.observe(duration / 1000.0)
        self.last_batch_ms.set(now)
        watermark = progress.get("eventTime", {}).get("watermark")
        if watermark and not watermark.startswith("1970-01-01"):
            ms = datetime.fromisoformat(watermark.replace("Z", "+00:00")).timestamp() * 1000
            lag = max(0.0, now - (ms + late_tolerance_ms) / 1000.0)
            self.watermark_lag.set(lag)
            if self._retention_s is not None:
                self.retention_headroom.set(self._retention_s[0] - self._retention_s[1] - lag)
        for source in progress.get("sources", []):
            end = _offsets(source.get("endOffset"), intake_topic)
            latest = _offsets(source.get("latestOffset"), intake_topic)
            for partition, offset in end.items():
                if partition != heartbeats:
                    self.delay_offset.labels(level=str(partition + 1)).set(offset)
            if latest:
                self.offsets_behind.set(sum(max(0, latest[p] - end.get(p, 0)) for p in latest))


def _offsets(value, topic: str) -> dict[int, int]:
    """`topic`'s offsets by partition in a progress report's source offsets (JSON or parsed)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return {int(p): int(o) for p, o in ((value or {}).get(topic) or {}).items()}


def build_metrics() -> Metrics:
    """The metrics of this driver, labelled with delayq's and Spark's versions."""
    try:
        own = version("delayq")
    except PackageNotFoundError:
        own = "0+unknown"
    return Metrics(CollectorRegistry(), version=own, spark_version=version("pyspark"))
