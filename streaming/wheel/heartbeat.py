"""The job's clock: a broker-stamped heartbeat on the intake's `heartbeat_partition` every
`heartbeat_ms`, since Spark's watermark (and so its timers) moves only when records arrive.
Sent by librdkafka, which costs the driver far less CPU than kafka-python."""
from __future__ import annotations

import logging
import threading

from conf.settings import Settings
from state import headers as H
from streaming.kafka.config import librdkafka_config

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(self, settings: Settings):
        super().__init__(name="delayq-heartbeat", daemon=True)
        self._settings = settings
        self._stop_event = threading.Event()
        self._failing = False

    def _delivered(self, err, _msg) -> None:
        if err is None:
            if self._failing:
                log.info("heartbeats to %s are delivered again", self._settings.intake_topic)
            self._failing = False
        elif not self._failing:
            # The broker may be restarting; time stands still until it is back.
            log.warning("heartbeat to %s failed (%s); retrying", self._settings.intake_topic,
                        err.str())
            self._failing = True

    def run(self) -> None:
        from confluent_kafka import Producer

        settings = self._settings
        producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 0, "acks": 1,
                             # a heartbeat not delivered in time is of no use later
                             "message.timeout.ms": max(10_000, 4 * settings.heartbeat_ms),
                             **librdkafka_config(settings)})
        interval = settings.heartbeat_ms / 1000.0
        while not self._stop_event.is_set():
            try:
                producer.produce(settings.intake_topic, value=b"",
                                 partition=settings.heartbeat_partition,
                                 headers=[(H.HEARTBEAT, b"1")], on_delivery=self._delivered)
            except BufferError:   # the broker has been away long enough to fill the queue
                pass
            producer.poll(0)
            self._stop_event.wait(interval)
        producer.flush(5)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
