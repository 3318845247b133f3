"""What the broker says of the topics a dispatch task's records go to (txn.py, task.py): one
missing, stuck or gone, and whether it answers the task's producer at all. No Spark import."""
from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

log = logging.getLogger(__name__)

# A topic found missing is looked up again at most this often, each look-up waiting this long
# at most for the broker's answer (the task's loop waits meanwhile).
_LOOK_AGAIN_S = 0.5
_LOOK_UP_S = 2.0


class Topics:
    """The look-ups of streaming/dispatch/txn.py's Transactions, mixed into it (the task's
    producer, consumer, config, partition and ledger topic)."""

    def __init__(self):
        # Topics known to exist, and those not: (first found missing or None, last looked up).
        self._topics: set[str] = set()
        self._missing: dict[str, tuple[float | None, float]] = {}
        self._admin: AdminClient | None = None   # a stuck topic's min.insync.replicas (`_stuck`)

    def _topic_ready(self, topic: str) -> bool | None:
        """Whether `topic` exists and takes records: None while it does not (missing, stuck
        (`_stuck`), or no answer): its rows wait aside (task.py), and it is looked up again at
        most every _LOOK_AGAIN_S; False once the broker has said it is missing for the producer's
        own wait: its rows are dead-lettered (sent, they would hold the commit that long, then
        abort it). A stuck topic's rows are never dead-lettered for it."""
        if topic in self._topics:
            return True
        first, looked = self._missing.get(topic, (None, 0.0))
        if time.monotonic() - looked >= _LOOK_AGAIN_S:
            exists = self._exists(topic)
            stuck = exists and self._stuck(topic)
            if exists is None or stuck:   # no answer (the broker away), or stuck: not gone
                if stuck and topic not in self._missing:
                    log.warning("dispatch %d: %s, %s; its rows wait", self.partition, topic, stuck)
                self._missing[topic] = None, time.monotonic()
                return None
            if exists:
                self._topics.add(topic)
                self._missing.pop(topic, None)
                return True
            first = time.monotonic() if first is None else first
            self._missing[topic] = first, time.monotonic()
        wait_s = self.config.producer.get("topic.metadata.propagation.max.ms", 30_000) / 1000
        return None if first is None or time.monotonic() - first < wait_s else False

    def _cut_off(self) -> bool:
        """Whether the broker answers the task's consumer and not its producer (librdkafka
        2.16's producer could lose a restarted broker for good: its records and look-ups waited
        until the transaction timed out, and its abort then hung)."""
        def answers(client) -> bool:
            try:
                client.list_topics(self.ledger.topic, timeout=_LOOK_UP_S)
                return True
            except KafkaException:
                return False
        return not answers(self.producer) and answers(self.consumer)

    def _held_up(self, topics: list[str]) -> str | None:
        """What holds the records to `topics`: a real topic gone, or stuck (its rows, read again,
        wait aside while the others leave); None: nothing found, the records are awaited (the
        broker away, or a topic of delayq's own stuck: nothing leaves without it)."""
        if gone := self._gone(topics):
            return f"{', '.join(gone)}, which no longer exists"
        for topic in topics:
            if topic in self._topics and (why := self._stuck(topic)):
                self._topics.discard(topic)
                return f"{topic}, {why}"
        return None

    def _stuck(self, topic: str) -> str | None:
        """Why `topic` takes no record though it exists (librdkafka would retry one until the
        transaction's timeout, a minute, holding it): a partition without a leader, or
        with fewer in-sync replicas than its min.insync.replicas (acks=all; at most its
        replicas). None: it takes them, or no answer."""
        try:
            found = self.producer.list_topics(topic, timeout=_LOOK_UP_S).topics.get(topic)
            if found is None or found.error is not None:
                return None
            parts = sorted(found.partitions.values(), key=lambda p: p.id)
            if leaderless := [p.id for p in parts if p.leader < 0 or p.error is not None]:
                return f"whose partition {leaderless[0]} has no leader"
            if self._admin is None:
                self._admin = AdminClient(self.config.producer)
            resource = ConfigResource("topic", topic)
            configs = self._admin.describe_configs([resource], request_timeout=_LOOK_UP_S)
            need = int(configs[resource].result(_LOOK_UP_S)["min.insync.replicas"].value)
        except (KafkaException, FutureTimeout):
            return None
        # The broker asks min(min.insync.replicas, replication factor) in sync.
        if short := [p for p in parts if len(p.isrs) < min(need, len(p.replicas))]:
            p = short[0]
            return f"whose partition {p.id} has {len(p.isrs)} in-sync replicas of the " \
                   f"{min(need, len(p.replicas))} its min.insync.replicas asks"
        return None

    def _gone(self, topics: list[str]) -> list[str]:
        """The `topics` the broker says do not exist (no answer: none, the broker away)."""
        answers = {topic: self._exists(topic, usable=False) for topic in topics}
        gone = [] if None in answers.values() else [t for t, on in answers.items() if not on]
        self._topics.difference_update(gone)
        return gone

    def _exists(self, topic: str, usable: bool = True) -> bool | None:
        """Whether the broker says `topic` exists (`usable`: and can take records now, no error
        such as a leader not yet elected); None: no answer within _LOOK_UP_S."""
        try:
            found = self.producer.list_topics(topic, timeout=_LOOK_UP_S).topics.get(topic)
        except KafkaException:
            return None
        if found is None or found.error is not None and \
                found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        return not usable or (found.error is None and bool(found.partitions))
