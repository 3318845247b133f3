"""A dispatch task's reading of the broker's clock (DESIGN.md section 3): rows are held until
it, never until this host's own."""
from __future__ import annotations

import logging
import time
from typing import Callable

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from state.errors import DispatchError

log = logging.getLogger(__name__)


class Skew:
    """This host against the broker's clock: the broker stamps a LogAppendTime record before this
    host sees its ack, so local time minus the stamp bounds the offset from above. The last
    window's smallest bound is kept on the monotonic clock (an NTP step moves nothing), so
    `broker_ms` is never ahead of the broker's: a row held until it is never early."""

    def __init__(self, topic: str, clock_tolerance_ms: int, window_s: float = 60.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self._topic, self._tolerance_ms = topic, clock_tolerance_ms
        self._window_s, self._clock, self._monotonic = window_s, clock, monotonic
        self._best: float | None = None   # monotonic ms minus the broker's ms, at most
        self._since = monotonic()
        self._far = False

    @property
    def measured(self) -> bool:
        return self._best is not None

    def observe(self, kind: int, broker_ms: int) -> None:
        """An acknowledgement's timestamp (its type and value) from the topic."""
        if kind != TIMESTAMP_LOG_APPEND_TIME:
            raise DispatchError(
                f"topic {self._topic} stamps its records with the producer's clock "
                f"(message.timestamp.type=CreateTime); the dispatch tasks measure their clocks "
                f"by its broker's. Fix: kafka-configs.sh --alter --entity-type topics "
                f"--entity-name {self._topic} --add-config message.timestamp.type=LogAppendTime")
        now = self._monotonic()
        bound = now * 1000 - broker_ms
        if self._best is None or now - self._since > self._window_s:
            self._best, self._since = bound, now
        else:
            self._best = min(self._best, bound)
        offset = self.offset_ms()
        if (abs(offset) > self._tolerance_ms / 2) != self._far:
            self._far = not self._far
            said = (f"this host's clock is {abs(offset) / 1000:.1f} s "
                    f"{'ahead of' if offset > 0 else 'behind'} the broker's ({self._topic})")
            if self._far:
                log.warning("%s, more than half of clock_tolerance (%d s): rows are held by the "
                            "broker's clock; check the hosts' time sync (NTP)", said,
                            self._tolerance_ms // 1000)
            else:
                log.info("%s, within half of clock_tolerance again", said)

    def offset_ms(self) -> float | None:
        """This host's wall clock minus the broker's, at most (None: not measured yet)."""
        if self._best is None:
            return None
        return (self._clock() - self._monotonic()) * 1000 + self._best

    def broker_ms(self) -> int:
        """The broker's clock now, at the latest (only once measured)."""
        return int(self._monotonic() * 1000 - self._best)
