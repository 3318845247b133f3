"""Fixtures for delivery tests: a running delay job on fresh topics, and a check that every
delivered record is on time, not early, and exactly as sent."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest

from tests.support import assert_eventually


@dataclass
class Sent:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    due_ms: int
    partition: int | None = None


@dataclass
class JobHandle:
    settings: object
    job: object
    checkpoint: str
    sent: dict[str, Sent] = field(default_factory=dict)


@pytest.fixture
def job_settings(test_settings, work_dir):
    """Factory: settings of a fresh intake/DLQ pair (and any overrides)."""
    from conf import load_settings

    def make(**overrides):
        tag = uuid.uuid4().hex[:8]
        base = dict(
            bootstrap_servers=test_settings.bootstrap_servers,
            data_dir=work_dir / f"data-{tag}",
            delay_levels=test_settings.delay_levels,
            dispatch_direct_max_delay_ms=test_settings.dispatch_direct_max_delay_ms,
            dispatch_topic_wait_ms=test_settings.dispatch_topic_wait_ms,
            ring_slots=test_settings.ring_slots, ring_slot_ms=test_settings.ring_slot_ms,
            ring_read_lead_ms=test_settings.ring_read_lead_ms,
            ring_write_ms=test_settings.ring_write_ms,
            spark_master=test_settings.spark_master,
            spark_shuffle_partitions=test_settings.spark_shuffle_partitions,
            ledger_interval=test_settings.ledger_interval,
            intake_topic=f"intake-{tag}",
            dlq_topic=f"intake-{tag}.DLQ",
        )
        base.update(overrides)
        return load_settings(**base)

    return make


@pytest.fixture
def start_job(spark, work_dir):
    """Factory: start a DelayJob (waiting for its first batch); all are stopped at teardown."""
    from streaming.job import DelayJob

    jobs = []

    def start(settings, checkpoint: str | None = None, **kwargs):
        checkpoint = checkpoint or str(work_dir / f"ckpt-{uuid.uuid4().hex[:8]}")
        job = DelayJob(settings, spark, checkpoint=checkpoint, **kwargs)
        jobs.append(job)
        job.start()
        assert_eventually(lambda: job.query.lastProgress is not None or _raise(job),
                          timeout_s=120, message="the job's first batch")
        return job

    yield start
    for job in jobs:
        job.stop()


def _raise(job):
    if not job.query.isActive and job.query.exception():
        raise AssertionError(f"job failed: {job.query.exception()}")
    return False
