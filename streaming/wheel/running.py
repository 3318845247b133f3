"""The wheel query's first batch and clean stop: the batch under way is committed, no other
begins, then the query stops."""
from __future__ import annotations

import logging
import time

from state.errors import JobError
from streaming.wheel.writer import BatchWriter

log = logging.getLogger(__name__)
# How long the stop waits for the query's thread to park in the writer before interrupting it.
PARK_WAIT_S = 5.0


def first_batch(query, timeout_s: float):
    """Wait for the first completed batch; return the query's error if it died first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.lastProgress is not None:
            return None
        if not query.isActive:
            return query.exception() or JobError("the query stopped before its first batch")
        time.sleep(0.2)
    return None  # slow, not failed: the caller's own deadlines decide


def finish_batch(query, writer: BatchWriter | None, grace_s: float) -> int | None:
    """Let no batch begin; wait for the one under way to commit: its id (None: none, or timeout)."""
    last = writer.close() if writer is not None else None
    if last is None:
        return None
    deadline = time.monotonic() + grace_s
    while query.isActive:
        progress = query.lastProgress   # reported once its batch is committed
        if progress is not None and progress["batchId"] >= last:
            return last
        if time.monotonic() > deadline:
            log.warning("batch %d still under way %.0f s after the stop was asked: stopping "
                        "the query, which interrupts the batch's Spark work; cut short, the "
                        "batch is not committed and runs again after the restart, sending "
                        "again what it had sent", last, grace_s)
            return None
        time.sleep(0.05)
    return None


def await_parked(query, writer: BatchWriter) -> None:
    """Wait for the next batch to park in the writer: the stop's interruption ends a parked
    thread cleanly, one still planning the batch has Spark log an error."""
    deadline = time.monotonic() + PARK_WAIT_S
    while query.isActive and time.monotonic() < deadline and not writer.parked.wait(0.1):
        pass


def stop_query(spark, query, writer: BatchWriter | None, thread_s: float) -> str | None:
    """Stop the query, waiting up to `thread_s` for its thread (stopTimeout; at 0 a stuck thread
    holds the stop forever). None once it has ended, else the error to raise."""
    spark.conf.set("spark.sql.streaming.stopTimeout", str(max(1, int(thread_s * 1000))))
    if writer is not None:
        writer.stopping = time.monotonic()
    try:
        query.stop()
    except Exception as e:   # Spark's TimeoutException; its cause holds the thread's stack
        if "failed to stop within" not in str(e):
            raise
        log.error("the query's thread did not end within %.0f s of the stop interrupting "
                  "it; the stop goes on without it. Where it was: %s", thread_s, e)
        return (f"the query's thread did not end within {thread_s:.0f} s of the stop (its "
                f"stack is in the log); a batch it had under way, unless it ends first, is "
                f"not committed and runs again after the restart")
    return None
