"""The streaming job: the wheel query fires each message into the ready topic, the dispatch tasks
send it when due, the ledger query records it; DelayJob starts, watches and stops the three:
    spark-submit --jars "$(ls .lib/spark/*.jar | paste -sd,)" streaming/cli/main.py run
"""
from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from typing import Callable

from pyspark.sql import SparkSession

from conf.settings import Settings
from sinks import store
from sinks.base import BatchSummary
from sinks.cold import ColdTier
from sinks.kafka import producer_options, sent_schema
from sinks.dead_letters import DeadLetterTable
from sinks.metrics import Metrics
from sinks.ready import ReadySink
from state.errors import JobError
from streaming.kafka import admin as kadmin
from streaming.wheel import checkpoint as ckpt
from streaming.wheel import running, sizing
from streaming.dispatch.supervisor import Dispatcher, failure_reason
from streaming.wheel.heartbeat import Heartbeat
from streaming.kafka.config import spark_options
from streaming.ledger.query import start_ledger_query
from streaming.spark.listener import OffsetMirror, ProgressJsonListener
from streaming.wheel.offsets import committed_offsets, latest_batch
from streaming.wheel.schema import WITH_BODY_SPARK
from streaming.stages import (dispatch_config, ledger_config_of, rules_of, supervision_of,
                              wheel_config_of)
from streaming.wheel.query import intake_stream, pending_by_level, wheel_stream
from streaming.wheel.writer import BatchWriter

log = logging.getLogger(__name__)


class DelayJob:
    def __init__(self, settings: Settings, spark: SparkSession, checkpoint: str | None = None,
                 on_batch: Callable[[BatchSummary], None] | None = None,
                 metrics: Metrics | None = None,
                 allow_fresh_checkpoint: bool = False, allow_config_change: bool = False):
        self.settings, self.spark, self.metrics = settings, spark, metrics
        self._allow_fresh = allow_fresh_checkpoint
        self._allow_config_change = allow_config_change
        self._on_batch = on_batch
        self.query_name = f"delayq-{settings.intake_topic}"
        self.checkpoint = checkpoint or str(settings.checkpoint_path)
        # The wheel writes only its rejections; the ledger query writes the ledger.
        self._dead_letters = (DeadLetterTable(settings.dead_letter_path, self.checkpoint)
                              if settings.ledger else None)
        self.startup_s: dict[str, float] = {}   # seconds per start-up step, in order
        self.first_batch_s: dict[str, float] = {}
        self._direct_was_on = False   # see streaming/wheel/checkpoint.py direct_was_on
        self._rules = None   # the parse's, with the checkpoint's seal (after its check)
        self.query = self.ledger_query = self._ledger_writer = self._admin = None
        self._listener = self._heartbeat = self._seeder = None
        self._writer: BatchWriter | None = None
        self._dispatcher: Dispatcher | None = None

    def _step(self, name: str) -> None:
        now = time.monotonic()
        self.startup_s[name] = round(now - self._step_t, 1)
        self._step_t = now

    def start(self, first_batch_timeout_s: float = 180.0):
        """Return the query once its first batch completed."""
        self._step_t = time.monotonic()
        largest = self._topics()
        self.settings = sizing.size_partitions(self.spark, self.settings, self.checkpoint)
        started_ms, now_ms = self._check_checkpoint()
        self._step("checkpoint")
        partitions, ledger_max = kadmin.ensure_dispatch_topics(self.settings, self._admin, largest)
        kadmin.ensure_ring(self.settings, self._admin, partitions, largest)
        kadmin.check_ring_positions(self.settings, self._admin)
        sizing.check_slots(self.spark, self.settings, partitions)
        writer = self._writer = self._batch_writer(partitions, largest)
        # The pending gauge starts from the last committed batch's state; this run adds deltas.
        seed_batch = latest_batch(store.path(self.checkpoint) / "commits")
        self._listen()
        self._step("listeners")
        intake_start = ({} if seed_batch is None or self._direct_was_on else
                        committed_offsets(store.path(self.checkpoint), self.settings.intake_topic))
        config = dispatch_config(self.settings, uuid.uuid4().hex, largest, partitions,
                                 intake_start, ledger_max, rules=self._rules)
        self._dispatcher = Dispatcher(
            self.spark, config, supervision_of(self.settings),
            on_commits=self.metrics.set_dispatch if self.metrics else None).start()
        self._step("dispatch")
        failure = self._start_wheel(writer, started_ms, now_ms, first_batch_timeout_s)
        if failure is not None:
            self.stop()
            raise JobError(f"the delivery query failed in its first batch: {failure}") from None
        # After the wheel's first batch, so the two first batches do not share the cores.
        self.ledger_query, self._ledger_writer = start_ledger_query(
            self.spark, ledger_config_of(self.settings), self.checkpoint, self.metrics,
            name=f"{self.query_name}-ledger")
        self._step("ledger")
        if self.metrics is not None and seed_batch is not None:
            self._seed_pending(seed_batch)
        return self.query

    def _topics(self) -> int:
        """The largest record the intake and dead-letter topics take."""
        self._admin = kadmin.admin_client(self.settings)
        largest = max(kadmin.ensure_topics(self.settings, self._admin), 1_048_576)
        retention_ms = kadmin.check_intake(self.settings, self._admin)
        if self.metrics is not None:
            self.metrics.set_retention(retention_ms, self.settings.intake_retention_needed_ms
                                       - self.settings.downtime_tolerance_ms)
        self._step("topics")
        return largest

    def _start_wheel(self, writer: BatchWriter, started_ms: int, now_ms: int, timeout_s: float):
        """Waits for the first batch; its error if it failed."""
        # The driver's clock may lead the brokers' by the tolerance.
        config = wheel_config_of(self.settings, now_ms - self.settings.clock_tolerance_ms)
        self.query = (wheel_stream(intake_stream(self.spark, self.settings),
                                   self._rules, config, overdue_before_ms=started_ms)
                      .writeStream
                      .queryName(self.query_name)
                      .foreachBatch(writer)
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=f"{self.settings.wheel_trigger_ms} milliseconds")
                      .start())
        query_start = time.monotonic()
        failure = running.first_batch(self.query, timeout_s)
        self._step("first_batch")
        if writer.first is not None:
            began, timings = writer.first
            self.first_batch_s = {"planning": round(began - query_start, 1),
                                  **{k: round(v, 1) for k, v in timings.items()}}
        return failure

    def _check_checkpoint(self) -> tuple[int, int]:
        """Returns (started_ms: level messages due before it pass through; now_ms: a new query's
        first watermark)."""
        store.check_reachable(self.settings.store_root)
        verdict = ckpt.check(self.settings, self.checkpoint,
                             lambda: ckpt.read_group_offsets(self._admin, self.settings,
                                                             self.checkpoint),
                             allow_fresh=self._allow_fresh,
                             allow_config_change=self._allow_config_change)
        now_ms = int(time.time() * 1000)
        started_ms = ckpt.started_ms(self.checkpoint, verdict, now_ms)
        self._direct_was_on = ckpt.direct_was_on(self.checkpoint, verdict)
        seal = ckpt.seal_of(self.checkpoint, verdict, lambda: kadmin.end_offsets(
            self._admin, self.settings.intake_topic))
        self._rules = rules_of(self.settings, *seal)
        ckpt.write_stamp(self.settings, self.checkpoint, started_ms, seal)
        return started_ms, now_ms

    def _batch_writer(self, partitions: int, largest: int) -> BatchWriter:
        """The wheel query's foreachBatch, its Delta tables created before the first batch."""
        kafka = ReadySink({**producer_options(self.settings), **spark_options(self.settings)},
                          self.settings.ready_topic, partitions,
                          self.settings.dispatch_direct_max_delay_ms,
                          self.settings.ring_horizon_ms, self.settings.cold_bucket_ms,
                          max_request_bytes=largest)
        self._step("dispatch_topics")
        intake = self.settings.intake_topic
        cold = ColdTier(self.spark, self.settings.cold_path, self.checkpoint, intake,
                        spark_options(self.settings), self.settings.cold_bucket_ms,
                        self.settings.roll_lead_ms, self._rules.seal_key,
                        lambda: kadmin.end_offsets(self._admin, intake))
        cold.loaded_until()   # read (or made) now: a marker gone with messages parked stops here
        observers = [h for h in (self.metrics.observe_batch if self.metrics else None,
                                 self._on_batch) if h]
        writer = BatchWriter(kafka, (intake, spark_options(self.settings), self.settings.dlq_topic),
                             self._dead_letters, observers, cold)
        self._step("cold_tier")
        if self._dead_letters is not None:
            self._dead_letters.ensure_table(self.spark, sent_schema(WITH_BODY_SPARK))
        self._step("tables")
        return writer

    def _listen(self) -> None:
        observers = [OffsetMirror(self.settings.intake_topic, self._mirror_commit)]
        if self.metrics is not None:
            observers.append(functools.partial(
                self.metrics.observe_progress, late_tolerance_ms=self.settings.late_tolerance_ms,
                intake_topic=self.settings.intake_topic,
                heartbeats=self.settings.heartbeat_partition))
        self._listener = ProgressJsonListener(self.query_name, *observers)
        self.spark.streams.addListener(self._listener)
        self._heartbeat = Heartbeat(self.settings)
        self._heartbeat.start()

    def failure(self) -> str | None:
        """Why the job cannot go on though its query runs: a dispatch stage gave up, or the
        ledger query stopped (its tables and the delivery metrics would go silent)."""
        ledger = self.ledger_query
        if ledger is not None and not ledger.isActive:
            exc = ledger.exception()
            return (f"the ledger query stopped: {failure_reason(exc)}" if exc is not None
                    else "the ledger query stopped")
        return self._dispatcher.failure if self._dispatcher is not None else None

    def lost_kept_rows(self) -> bool:
        """Whether the query failed because an executor lost a batch's kept rows."""
        return self._writer is not None and self._writer.lost_kept_rows

    def restart(self) -> None:
        """As a restarted driver would: the failed batch is not committed and runs again."""
        self.stop()
        self.start()

    def _mirror_commit(self, offsets: dict[int, int]) -> None:
        admin = self._admin
        if admin is None:   # a progress event can still arrive after stop()
            return
        try:
            ckpt.mirror_offsets(admin, self.settings, offsets)
        except Exception:
            if self._admin is not None:
                raise   # the listener logs it; closed by the stop meanwhile, it is no error

    def _seed_pending(self, batch_id: int) -> None:
        def seed():
            # Wait for the second batch: after a restart the first reruns the last run's, and
            # the next carries the first new deliveries; the read would share their cores.
            first = self.query.lastProgress["batchId"]
            deadline = time.monotonic() + 60
            while (time.monotonic() < deadline and self.query.isActive
                   and (self.query.lastProgress or {}).get("batchId", first) <= first):
                time.sleep(0.2)
            t0 = time.monotonic()
            try:
                self.metrics.add_pending(pending_by_level(self.spark, self.checkpoint, batch_id))
            except Exception as e:  # a gauge, never a reason to stop delivering
                log.warning("could not read the pending messages of batch %d from the state: %s",
                            batch_id, e)
                return
            log.info("pending gauge seeded from batch %d in %.1f s", batch_id,
                     time.monotonic() - t0)
        self._seeder = threading.Thread(target=seed, name="delayq-pending-seed", daemon=True)
        self._seeder.start()

    def stop(self, grace_s: float = 30.0, thread_s: float = 30.0) -> None:
        """The batch under way commits (up to `grace_s`), then the query stops. A query thread
        still running `thread_s` later is left to end with the process; JobError after the rest."""
        stuck = None
        try:
            if self.query is not None:
                committed = running.finish_batch(self.query, self._writer, grace_s)
                if committed is not None:
                    running.await_parked(self.query, self._writer)
                stuck = running.stop_query(self.spark, self.query, self._writer, thread_s)
            # After the wheel: a task ends at its stop record, and the wheel writes nothing after.
            if self._dispatcher is not None:
                self._dispatcher.stop()
                self._dispatcher = None
            if self.ledger_query is not None:
                self._ledger_writer.finish()
                self.ledger_query.stop()
                self.ledger_query = None
            if self._listener is not None:
                self.spark.streams.removeListener(self._listener)
            self._listener = None
            if self._seeder is not None:
                self._seeder.join(timeout=30)
        finally:
            admin, self._admin = self._admin, None
            if admin is not None:   # a commit it still runs fails, and knows why (_mirror_commit)
                admin.close()
            if self._heartbeat is not None:
                self._heartbeat.stop()
        if stuck is not None:
            raise JobError(stuck)
