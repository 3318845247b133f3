"""Each stage's frozen config (the parse's Rules, the wheel's WheelConfig, the dispatch's
DispatchConfig and Supervision, the ledger query's LedgerConfig), built from the settings in this
one place."""
from __future__ import annotations

from conf.settings import Settings
from sinks import store
from state.envelope import Rules
from state.groups import WheelConfig
from streaming.dispatch.ring import RingConfig
from streaming.dispatch.rules import DispatchConfig
from streaming.dispatch.supervisor import Supervision
from streaming.kafka.config import librdkafka_config, spark_options
from streaming.ledger.query import LedgerConfig


def rules_of(settings: Settings, seal_key: str, legacy_before: tuple[int, ...] = ()) -> Rules:
    """`seal_key`, `legacy_before`: the checkpoint's (streaming/wheel/checkpoint.py seal_of);
    a tool that reads no service record passes any key."""
    return Rules(level_delays_ms=settings.level_delays_ms, intake_topic=settings.intake_topic,
                 dlq_topic=settings.dlq_topic, allowed_topics=settings.allowed_topic_set,
                 max_delay_ms=settings.max_delay_ms,
                 clock_tolerance_ms=settings.clock_tolerance_ms,
                 near_horizon_ms=settings.near_horizon_ms, cold_bucket_ms=settings.cold_bucket_ms,
                 timer_parts=settings.timer_parts, ring_horizon_ms=settings.ring_horizon_ms,
                 rolls_to_ring=settings.rolls_to_ring, seal_key=seal_key,
                 legacy_before=legacy_before)


def wheel_config_of(settings: Settings, first_watermark_ms: int = 0) -> WheelConfig:
    return WheelConfig(slot_ms=settings.slot_ms, lead_ms=settings.fire_lead_ms,
                       lead_per_message_us=settings.fire_lead_per_message_us,
                       watermark_delay_ms=settings.late_tolerance_ms,
                       first_watermark_ms=first_watermark_ms, dlq_topic=settings.dlq_topic,
                       timer_parts=settings.timer_parts,
                       spread=settings.spark_shuffle_partitions,
                       direct_max_delay_ms=settings.dispatch_direct_max_delay_ms)


# A dispatch task's clients try a broker that went away again every second at least (Kafka's
# Java client's default; librdkafka's 10 s could leave its producer unanswered that long after a
# broker's return, its consumer answered: past `dispatch_producer_stall`, a needless restart).
_RECONNECT = {"reconnect.backoff.max.ms": 1000}


def _dispatch_consumer(settings: Settings) -> dict:
    return {"bootstrap.servers": settings.bootstrap, **librdkafka_config(settings),
            "group.id": f"delayq.{settings.intake_topic}.dispatch",
            # fetch.wait.max.ms stays 500: shorter waits cost the broker 1/5 core when idle.
            # As the wheel's source: an aborted transaction's intake write is never delivered.
            "isolation.level": "read_committed", **_RECONNECT}


def dispatch_config(settings: Settings, run_id: str, max_request_bytes: int, partitions: int,
                    intake_start: dict[int, int], ledger_max_bytes: int, *,
                    rules: Rules) -> DispatchConfig:
    """`max_request_bytes`: largest record sent; `ledger_max_bytes`: ledger max.message.bytes;
    `rules`: the wheel's (`rules_of`)."""
    consumer = _dispatch_consumer(settings)
    exactly = settings.delivery == "exactly_once"
    # Keyed rows without REAL_QID are placed as Kafka's Java client does (murmur2); an unknown
    # REAL_TOPIC is awaited `dispatch_topic_wait_ms` before the row is dead-lettered; batch.size
    # no larger than the ledger topic takes, or a refused batch is refused again whole.
    producer = {"bootstrap.servers": settings.bootstrap, "linger.ms": 1, "acks": "all",
                "message.max.bytes": max_request_bytes, "enable.idempotence": True,
                "partitioner": "murmur2_random", "batch.size": min(1_000_000, ledger_max_bytes),
                "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_097_151,
                "topic.metadata.propagation.max.ms": settings.dispatch_topic_wait_ms,
                **_RECONNECT, **librdkafka_config(settings)}
    return DispatchConfig(consumer=consumer, producer=producer,
                          ready_topic=settings.ready_topic, ledger_topic=settings.ledger_topic,
                          dlq_topic=settings.dlq_topic, run_id=run_id, rules=rules,
                          commit_interval_s=(settings.dispatch_transaction_ms if exactly
                                             else settings.dispatch_commit_interval_ms) / 1000,
                          max_held=settings.dispatch_max_held, jvm_nice=settings.dispatch_jvm_nice,
                          fetch_gap=settings.dispatch_fetch_gap,
                          gather_s=settings.dispatch_gather_ms / 1000,
                          urgent_gather_s=settings.dispatch_urgent_gather_ms / 1000,
                          retry_backoff_s=settings.dispatch_retry_backoff_ms / 1000,
                          probe_interval_s=settings.dispatch_probe_interval_ms / 1000,
                          ledger_batch=settings.dispatch_ledger_batch, ring=ring_of(settings),
                          read_batch=settings.dispatch_read_batch,
                          ledger_bytes=min(ledger_max_bytes, max_request_bytes),
                          clock_tolerance_ms=settings.clock_tolerance_ms,
                          intake_refresh_s=settings.dispatch_intake_refresh_ms / 1000,
                          skip_deadline_s=settings.dispatch_skip_deadline_s,
                          ack_check_s=settings.dispatch_ack_check_ms / 1000,
                          stall_s=settings.dispatch_producer_stall_s,
                          intake_topic=settings.intake_topic,
                          direct_max_delay_ms=settings.dispatch_direct_max_delay_ms,
                          ready_partitions=partitions, intake_start=intake_start,
                          transactional_id=consumer["group.id"] if exactly else "",
                          offsets_interval_s=settings.dispatch_commit_interval_ms / 1000)


def ring_of(settings: Settings) -> RingConfig:
    slots = settings.ring_slots if settings.ring_horizon_ms else 0
    return RingConfig(settings.ring_topic, slots, settings.ring_slot_ms,
                      settings.ring_read_lead_ms, settings.fire_lead_per_message_us,
                      settings.ring_markers_wait_ms, settings.ring_write_ms)


def supervision_of(settings: Settings) -> Supervision:
    return Supervision(liveness_timeout_s=settings.dispatch_liveness_timeout_ms / 1000,
                       kill_timeout_s=settings.dispatch_kill_timeout_s,
                       failure_window_s=settings.dispatch_failure_window_ms / 1000,
                       max_failures=settings.dispatch_max_failures,
                       restart_backoff_ms=settings.dispatch_restart_backoff_ms)


def ledger_config_of(settings: Settings) -> LedgerConfig:
    return LedgerConfig(source=spark_options(settings), topic=settings.ledger_topic,
                        tables=settings.ledger, ledger_path=str(settings.ledger_path),
                        dead_letter_path=str(settings.dead_letter_path),
                        interval_ms=settings.ledger_interval_ms,
                        table_options=store.object_store_options(settings))
