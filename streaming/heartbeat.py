"""The job's own clock: a heartbeat record on the intake every `heartbeat_ms`, in the intake's
partition after the levels' (`heartbeat_partition`).

Spark's watermark moves only when records arrive, and event-time timers fire only when it
moves. The heartbeat is stamped by the broker (LogAppendTime) like every intake record, so it
advances time to the broker's clock and no further; the parse stage drops it.
"""
from __future__ import annotations

import logging
import threading

from kafka import KafkaProducer
from kafka.errors import KafkaError

from conf.settings import Settings
from state import headers as H
from streaming.kafka_config import python_client_config

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(self, settings: Settings):
        super().__init__(name="delayq-heartbeat", daemon=True)
        self._settings = settings
        self._stop_event = threading.Event()
        self.sent = 0

    def run(self) -> None:
        producer = None
        interval = self._settings.heartbeat_ms / 1000.0
        while not self._stop_event.is_set():
            try:
                if producer is None:
                    producer = KafkaProducer(linger_ms=0, acks=1, enable_idempotence=False,
                                             **python_client_config(self._settings))
                producer.send(self._settings.intake_topic, value=b"",
                              partition=self._settings.heartbeat_partition,
                              headers=[(H.HEARTBEAT, b"1")])
                self.sent += 1
            except KafkaError as exc:
                # The broker may be restarting; time stands still until it is back.
                log.warning("heartbeat to %s failed (%s); retrying",
                            self._settings.intake_topic, exc)
                self._stop_event.wait(1.0)
            self._stop_event.wait(interval)
        if producer is not None:
            producer.close(timeout=5)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
