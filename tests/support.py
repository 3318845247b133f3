"""Helpers shared by integration and fault tests: polling with a deadline, free ports,
consuming a topic to the end."""
from __future__ import annotations

import socket
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_eventually(check: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.5,
                      message: str = "condition") -> T:
    """Poll `check` until it returns a truthy value or raises nothing; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
            last_error = None
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f": {last_error}" if last_error else ""
            raise AssertionError(f"{message} not met within {timeout_s:.0f} s{detail}")
        time.sleep(interval_s)


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0,
                idle_s: float = 0.0) -> list:
    """Read `topic` from the beginning until `expected` records arrived (and then `idle_s`
    more seconds, to catch extras) or the deadline passes. Returns ConsumerRecords."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
    )
    records: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(records) < expected:
            records.extend(consumer)
        settle = time.monotonic() + idle_s
        while time.monotonic() < settle:
            records.extend(consumer)
    finally:
        consumer.close()
    return records
