"""On the real stack: the consumer group mirrors the checkpoint's offsets, and a lost or
differently configured checkpoint is refused before the query starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from conf import load_settings
from streaming.kafka.admin import admin_client
from streaming.wheel.checkpoint import CheckpointError, read_group_offsets
from streaming.job import DelayJob
from streaming.wheel.offsets import committed_offsets
from streaming.producer import DelayProducer
from tests.support import assert_eventually


def test_lost_or_reconfigured_checkpoint_is_refused(job_settings, start_job, new_topic, spark,
                                                     work_dir):
    settings = job_settings()
    real = new_topic(message_timestamp_type="LogAppendTime")
    checkpoint = str(work_dir / f"ckpt-{settings.intake_topic}")
    job = start_job(settings, checkpoint=checkpoint)
    with DelayProducer(settings) as producer:
        for level in (1, 2, 3):
            producer.send(real, b"v", level=level)
    admin = admin_client(settings)
    try:
        # The group follows the checkpoint: the offsets of its last committed batch.
        def mirrored():
            group = read_group_offsets(admin, settings, checkpoint)
            ckpt = committed_offsets(Path(checkpoint), settings.intake_topic)
            return group if group and group == ckpt and sum(group.values()) >= 3 else None
        assert_eventually(mirrored, timeout_s=60, message="group offsets = checkpoint offsets")
        job.stop()   # its last batch (heartbeats at least) may move the group once more
        group = read_group_offsets(admin, settings, checkpoint)
    finally:
        admin.close()

    lost = DelayJob(settings, spark, checkpoint=str(work_dir / f"gone-{settings.intake_topic}"))
    with pytest.raises(CheckpointError, match="missing or empty") as err:
        lost.start()
    lost.stop()
    assert f"delayq.{settings.intake_topic}" in str(err.value)
    assert all(f"{p}:{o}" in str(err.value) for p, o in group.items())

    moved = load_settings(**{**settings.model_dump(), "delay_levels": "1s 2s 4s"})
    reconfigured = DelayJob(moved, spark, checkpoint=checkpoint)
    with pytest.raises(CheckpointError, match=r"level_delays_ms: \[1000, 2000, 3000\] in the checkpoint"):
        reconfigured.start()
    reconfigured.stop()
    assert reconfigured.query is None, "refused before any query started"
