"""The producer client: send a message to be delivered later, and cancel it. A level-L message
goes to intake partition L-1, as RocketMQ writes it to queue L-1."""
from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass
from typing import Iterable

from kafka import KafkaProducer

from conf.settings import Settings
from state import headers as H
from state.envelope import TIMER_LEVEL
from state.levels import clamp_level
from streaming.kafka.config import python_client_config


@dataclass(frozen=True)
class Handle:
    uniq_key: str
    level: int          # 1..N, 0 for immediate, -1 for a timer
    due_ms: int         # broker append time + delay (the due time the service computes)
    partition: int
    offset: int

    def token(self) -> str:
        """For `delayq cancel`: uniq_key@due_ms@level."""
        return f"{self.uniq_key}@{self.due_ms}@{self.level}"

    @classmethod
    def parse(cls, token: str) -> "Handle":
        try:
            uniq, due, level = token.rsplit("@", 2)
            return cls(uniq, int(level), int(due), -1, -1)
        except ValueError:
            raise ValueError(f"handle {token!r} is not of the form UNIQ_KEY@DUE_MS@LEVEL") from None


def new_uniq_key() -> str:
    return uuid.uuid4().hex.upper()


class DelayProducer:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._producer = KafkaProducer(acks="all", linger_ms=5, **python_client_config(settings))
        self._partitions: int | None = None

    def __enter__(self) -> "DelayProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._producer.close()

    def intake_partitions(self) -> int:
        if self._partitions is None:
            found = self._producer.partitions_for(self.settings.intake_topic)
            if not found:
                raise ValueError(f"intake topic {self.settings.intake_topic} does not exist; "
                                 f"run `delayq run` or `delayq produce` once")
            self._partitions = len(found)
        return self._partitions

    def intake_partition(self, level: int, uniq_key: str) -> int:
        count = self.intake_partitions()
        if level > 0:
            return (level - 1) % count
        if level == TIMER_LEVEL:
            return zlib.crc32(uniq_key.encode()) % count
        return 0

    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None,
             level: int = 0, partition: int | None = None,
             headers: Iterable[tuple[str, bytes]] = (), uniq_key: str | None = None,
             deliver_at_ms: int | None = None, delay_ms: int | None = None) -> Handle:
        """Block until the broker has it."""
        if sum(x is not None for x in (deliver_at_ms, delay_ms)) + (level != 0) > 1:
            raise ValueError("give at most one of level, deliver_at_ms, delay_ms")
        uniq = uniq_key or new_uniq_key()
        wire = [(H.REAL_TOPIC, topic.encode()), (H.UNIQ_KEY, uniq.encode())]
        if partition is not None:
            wire.append((H.REAL_QID, str(partition).encode()))
        if level:
            level = clamp_level(level, len(self.settings.level_delays_ms))
            wire.append((H.DELAY, str(level).encode()))
        elif deliver_at_ms is not None:
            level = TIMER_LEVEL
            wire.append((H.TIMER_DELIVER_MS, str(int(deliver_at_ms)).encode()))
        elif delay_ms is not None:
            level = TIMER_LEVEL
            wire.append((H.TIMER_DELAY_MS, str(int(delay_ms)).encode()))
        wire.extend((name, bytes(val)) for name, val in headers)
        meta = self._producer.send(self.settings.intake_topic, key=key, value=value, headers=wire,
                                   partition=self.intake_partition(level, uniq),
                                   ).get(timeout=self.settings.produce_timeout_s)
        return Handle(uniq, level, self._due(meta.timestamp, level, deliver_at_ms, delay_ms),
                      meta.partition, meta.offset)

    def cancel(self, handle: Handle) -> None:
        """Too late (delivered, or past due time minus the fire lead) changes nothing and is
        counted (delayq_cancel_misses_total)."""
        wire = [(H.TIMER_DEL_UNIQKEY, handle.uniq_key.encode()),
                (H.TIMER_DELIVER_MS, str(handle.due_ms).encode())]
        if handle.level > 0:
            wire.insert(1, (H.DELAY, str(handle.level).encode()))
        self._producer.send(self.settings.intake_topic, value=b"", headers=wire,
                            partition=self.intake_partition(handle.level, handle.uniq_key),
                            ).get(timeout=self.settings.produce_timeout_s)

    def _due(self, append_ms: int, level: int, deliver_at_ms, delay_ms) -> int:
        if level > 0:
            return append_ms + self.settings.level_delays_ms[level - 1]
        if deliver_at_ms is not None:
            return max(int(deliver_at_ms), append_ms)
        return append_ms + int(delay_ms or 0)
