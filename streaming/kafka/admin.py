"""Topic administration: create delayq's topics, check the intake's settings, count partitions."""
from __future__ import annotations

import socket
import logging
import time
from contextlib import closing, nullcontext, suppress

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from conf.settings import Settings
from state.errors import JobError
from streaming.kafka.config import python_client_config

log = logging.getLogger(__name__)

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
# Room for the service's headers and batch framing: what the intake took, the DLQ takes too.
DLQ_HEADROOM_BYTES = 16_384
KAFKA_DEFAULT_MAX_MESSAGE = 1_048_588
KAFKA_DEFAULT_RETENTION_MS = 7 * 24 * 3_600_000


def intake_configs(settings: Settings) -> dict[str, str]:
    """Records kept, never compacted, at least as long as a pending body is needed."""
    keep = max(KAFKA_DEFAULT_RETENTION_MS, settings.intake_retention_needed_ms)
    return {**LOG_APPEND_TIME, "cleanup.policy": "delete", "retention.ms": str(keep)}


def admin_client(settings: Settings) -> KafkaAdminClient:
    """A one-line JobError when no broker answers, instead of kafka-python's tens of lines."""
    client_log = logging.getLogger("kafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        return KafkaAdminClient(**python_client_config(settings),
                                bootstrap_timeout_ms=int(settings.connect_timeout_s * 1000))
    except KafkaError as exc:
        raise JobError(unreachable_reason(settings, exc)) from None
    finally:
        client_log.setLevel(level)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def unreachable_reason(settings: Settings, exc: Exception) -> str:
    """Nothing listens, or the handshake failed (kafka-python reports a failed SASL login or TLS
    handshake only as a bootstrap timeout)."""
    who = f"security_protocol={settings.security_protocol}"
    if settings.security_protocol.startswith("SASL"):
        who += f", sasl_mechanism={settings.sasl_mechanism}, user {settings.sasl_username!r}"
    if settings.security_protocol.endswith("SSL"):
        who += f", ssl_cafile={settings.ssl_cafile or '(system CAs)'}"
    answering = [a for a in settings.bootstrap.split(",")
                 if ":" in a and port_open(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1]))]
    if answering:
        return (f"Kafka at {', '.join(answering)} accepts connections but the client could not "
                f"log in ({who}): authentication failed, the broker's TLS certificate is not "
                f"trusted, or the security protocol does not match the listener. Check the "
                f"credentials, DELAYQ_SSL_CAFILE and DELAYQ_SECURITY_PROTOCOL. ({exc})")
    return (f"no Kafka broker answers at {settings.bootstrap} ({who}): {exc}. Check that the "
            f"brokers are up, that DELAYQ_BOOTSTRAP_SERVERS names their listeners, and that "
            f"this host reaches them")


def create_topic(admin: KafkaAdminClient, name: str, partitions: int,
                 configs: dict[str, str] | None = None) -> bool:
    """False if it already existed."""
    try:
        # One replica on a single broker, else the broker's default (-1).
        replicas = 1 if len(admin.describe_cluster().get("brokers", [])) <= 1 else -1
        admin.create_topics([NewTopic(name, partitions, replicas, topic_configs=configs or {})],
                            wait_for_metadata=True)
        return True
    except TopicAlreadyExistsError:
        return False
    except KafkaError as exc:
        raise JobError(unprepared(admin, name, "could not be created", exc)) from None


def unprepared(admin: KafkaAdminClient, topic: str, what: str, exc: Exception) -> str:
    servers = ",".join(admin.config.get("bootstrap_servers") or [])
    return (f"topic {topic} {what} on Kafka at {servers}: {type(exc).__name__}: "
            f"{str(exc).strip() or 'no detail'}. Check that the brokers are up and healthy (their "
            f"logs), that this user may create and describe topics, and the topic's name and "
            f"settings")


def _grow(admin: KafkaAdminClient, topic: str, partitions: int) -> None:
    have = topic_partitions(admin, [topic])[topic]
    if have is not None and have < partitions:
        try:
            admin.create_partitions({topic: NewPartitions(total_count=partitions)})
        except KafkaError as exc:
            raise JobError(unprepared(admin, topic, "could not get its partitions", exc)) from None
        log.info("topic %s: %d partitions added (the heartbeats' partition)", topic,
                 partitions - have)


def ensure_topics(settings: Settings, admin: KafkaAdminClient | None = None) -> int:
    """The intake (a partition per level and the heartbeats', grown if fewer) and dead-letter
    topics; returns the largest record the service must write (the dead-letter topic's limit)."""
    with closing(admin_client(settings)) if admin is None else nullcontext(admin) as admin:
        wanted_parts = settings.heartbeat_partition + 1
        if not create_topic(admin, settings.intake_topic, wanted_parts, intake_configs(settings)):
            _grow(admin, settings.intake_topic, wanted_parts)
        intake_max = max_message_bytes(admin, settings.intake_topic) or KAFKA_DEFAULT_MAX_MESSAGE
        wanted = max(intake_max + DLQ_HEADROOM_BYTES, KAFKA_DEFAULT_MAX_MESSAGE)
        create_topic(admin, settings.dlq_topic, 1, {"max.message.bytes": str(wanted)})
        return max_message_bytes(admin, settings.dlq_topic) or wanted


def ensure_dispatch_topics(settings: Settings, admin: KafkaAdminClient,
                           largest: int) -> tuple[int, int]:
    """The ready and ledger topics (LogAppendTime: its acks time the dispatch tasks' clocks);
    returns the ready partitions (an existing topic's own) and the ledger's max.message.bytes."""
    create_topic(admin, settings.ready_topic, settings.ready_partitions,
                 {"max.message.bytes": str(largest + DLQ_HEADROOM_BYTES)})
    if not create_topic(admin, settings.ledger_topic, settings.ready_partitions, LOG_APPEND_TIME):
        require_log_append_time(admin, settings.ledger_topic, "the dispatch tasks time their "
                                "clocks by its broker's append time")
    # A new topic may be unknown to the answering broker for a moment (seen on 3 brokers).
    deadline = time.monotonic() + settings.connect_timeout_s
    while None in (parts := topic_partitions(admin, [settings.ready_topic, settings.ledger_topic])
                   ).values() and time.monotonic() < deadline:
        time.sleep(0.2)
    ready, ledger = parts[settings.ready_topic], parts[settings.ledger_topic]
    if ready != ledger:
        raise JobError(f"topic {settings.ready_topic} has {ready} partitions and "
                         f"{settings.ledger_topic} {ledger}: a dispatch task writes the ledger "
                         f"partition of its ready partition; give both the same count")
    return ready, max_message_bytes(admin, settings.ledger_topic) or KAFKA_DEFAULT_MAX_MESSAGE


def ensure_ring(settings: Settings, admin: KafkaAdminClient, tasks: int, largest: int) -> None:
    """The dispatch tasks' rings (streaming/dispatch/ring.py): `tasks` x ring_slots partitions of
    <intake>.TIMERS, LogAppendTime, keeping a record the ring's turn and downtime_tolerance;
    an existing one is refused with the fix when it differs (its partitions are frozen)."""
    if not settings.ring_horizon_ms:
        return
    topic, wanted = settings.ring_topic, tasks * settings.ring_slots
    keep = settings.ring_slots * settings.ring_slot_ms + settings.downtime_tolerance_ms
    if create_topic(admin, topic, wanted, {**LOG_APPEND_TIME, "retention.ms": str(keep),
                                           "max.message.bytes": str(largest + DLQ_HEADROOM_BYTES)}):
        return   # made so (and a new topic may be unknown to the answering broker for a moment)
    why = "the ring holds timers until their slot is read"
    require_log_append_time(admin, topic, why)
    have = topic_partitions(admin, [topic])[topic]
    if have != wanted:
        raise JobError(f"topic {topic} has {have} partitions; the dispatch tasks' rings need "
                       f"{wanted} ({tasks} tasks x ring_slots {settings.ring_slots}). Put "
                       f"ring_slots back, or let the job drain and delete the topic")
    retention = int(topic_config(admin, topic, "retention.ms") or KAFKA_DEFAULT_RETENTION_MS)
    if 0 <= retention < keep:
        raise JobError(f"topic {topic} has retention.ms={retention}, and {why}, up to {keep} ms "
                       f"(a turn of the ring and downtime_tolerance). Fix: kafka-configs.sh "
                       f"--alter --entity-type topics --entity-name {topic} --add-config "
                       f"retention.ms={keep}")


def check_ring_positions(settings: Settings, admin: KafkaAdminClient) -> None:
    """Refuse a start whose dispatch tasks would read a ring partition from below its log's
    start: what retention deleted there were timers not yet delivered."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    if not settings.ring_horizon_ms:
        return
    group, topic = f"delayq.{settings.intake_topic}.dispatch", settings.ring_topic
    committed = {tp.partition: meta.offset for tp, meta in
                 admin.list_group_offsets({group: None}).get(group, {}).items()
                 if tp.topic == topic and meta.offset >= 0}
    if not committed:
        return
    starts = admin.list_partition_offsets(
        {TopicPartition(topic, p): OffsetSpec.EARLIEST for p in committed})
    lost = {tp.partition: (committed[tp.partition], found.offset) for tp, found in starts.items()
            if found.offset > committed[tp.partition]}
    if lost:
        shown = ", ".join(f"{p}: committed {c}, log starts at {s}" for p, (c, s) in sorted(
            lost.items()))
        raise JobError(f"ring topic {topic} lost timers to its retention before the dispatch "
                       f"tasks read them ({shown}). Raise its retention.ms (and "
                       f"downtime_tolerance) to keep this from happening; to start anyway, "
                       f"accepting the loss: kafka-consumer-groups.sh --group {group} "
                       f"--reset-offsets --to-earliest --topic {topic} --execute")


def require_log_append_time(admin: KafkaAdminClient, topic: str, why: str) -> None:
    """Refuse a topic without LogAppendTime, naming the fix (delayq alters no topic it finds)."""
    kind = topic_config(admin, topic, "message.timestamp.type")
    if kind != "LogAppendTime":
        raise JobError(f"topic {topic} has message.timestamp.type={kind}; {why}. Fix: "
                       f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
                       f"--add-config message.timestamp.type=LogAppendTime")


def topic_config(admin: KafkaAdminClient, topic: str, key: str) -> str | None:
    """Its own value, else the broker's default."""
    try:
        answer = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)],
                                        config_filter="all").get("topic", {})
    except KafkaError as exc:
        raise JobError(unprepared(admin, topic, "could not be described", exc)) from None
    entry = answer.get(topic, {}).get(key)
    return entry.get("value") if entry else None


def max_message_bytes(admin: KafkaAdminClient, topic: str) -> int | None:
    value = topic_config(admin, topic, "max.message.bytes")
    return int(value) if value else None


def check_intake(settings: Settings, admin: KafkaAdminClient) -> int:
    """Refuse an intake without LogAppendTime, or that may delete a record before it is due (the
    wheel holds references, not bodies). Returns its retention.ms (-1: kept for ever)."""
    topic = settings.intake_topic
    require_log_append_time(admin, topic, "delayq takes time from the broker only")
    fix = f"Fix: kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config"
    needed = settings.intake_retention_needed_ms
    why = (f"the wheel holds references to the intake's records, whose bodies are read back "
           f"when due, up to {needed} ms (near_horizon + cold_bucket + clock_tolerance + "
           f"downtime_tolerance) after their append")
    policy = topic_config(admin, topic, "cleanup.policy") or "delete"
    if "compact" in policy:
        raise JobError(f"intake topic {topic} has cleanup.policy={policy}: compaction deletes "
                       f"records by key, and {why}. {fix} cleanup.policy=delete")
    retention = int(topic_config(admin, topic, "retention.ms") or KAFKA_DEFAULT_RETENTION_MS)
    if 0 <= retention < needed:
        raise JobError(f"intake topic {topic} has retention.ms={retention}, and {why}. {fix} "
                       f"retention.ms={needed} (or more), or lower downtime_tolerance")
    size = int(topic_config(admin, topic, "retention.bytes") or -1)
    if size >= 0:
        raise JobError(f"intake topic {topic} has retention.bytes={size}: a full partition "
                       f"deletes records however young, and {why}. {fix} retention.bytes=-1")
    return retention


def end_offsets(admin: KafkaAdminClient, topic: str) -> dict[int, int]:
    """Partition → the offset the next record of `topic` will take."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    partitions = topic_partitions(admin, [topic])[topic] or 0
    answer = admin.list_partition_offsets(
        {TopicPartition(topic, p): OffsetSpec.LATEST for p in range(partitions)})
    return {tp.partition: found.offset for tp, found in answer.items()}


def topic_partitions(admin: KafkaAdminClient, topics: list[str]) -> dict[str, int | None]:
    """None for a topic that does not exist."""
    try:
        described = admin.describe_topics(topics)
    except KafkaError:   # UnknownTopicOrPartitionError among them: one by one
        described = []
        for topic in topics:
            with suppress(KafkaError):
                described += admin.describe_topics([topic])
    found = {info.get("name"): len(info["partitions"]) for info in described
             if info and info.get("error_code", 0) == 0 and info.get("partitions")}
    return {topic: found.get(topic) for topic in topics}
