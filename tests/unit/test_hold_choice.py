"""Which hold a job takes (streaming/job.py `DelayJob._driver_hold`): the driver's needs a
checkpoint folder to spool into, and falls back to the tasks' hold, saying so, on a store. No
JVM: the choice is made before Spark is asked for anything."""
import logging

import pyarrow as pa

from conf import load_settings
from sinks.driver_hold import SPOOL_FOLDER, DriverHold
from streaming.job import DelayJob


def choice(tmp_path, checkpoint: str, **settings):
    job = DelayJob(load_settings(data_dir=tmp_path / "data", bootstrap_servers="127.0.0.1:1",
                                 **settings), spark=None, checkpoint=checkpoint)
    return job._driver_hold(1_048_576)


def test_the_driver_hold_is_the_default_on_a_checkpoint_folder(tmp_path):
    hold = choice(tmp_path, str(tmp_path / "ckpt"))
    try:
        assert isinstance(hold, DriverHold)
        assert hold.folder == tmp_path / "ckpt" / SPOOL_FOLDER
    finally:
        hold.stop()   # never started: closes its producer


def test_on_an_object_store_the_job_falls_back_to_the_tasks_hold_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        assert choice(tmp_path, "s3a://bucket/delayq/ckpt") is None
    assert "needs a checkpoint on a local or mounted folder" in caplog.text
    assert "fire_lead_ms = 2000" in caplog.text


def test_the_tasks_hold_takes_no_driver_hold_unless_a_spool_was_left(tmp_path):
    checkpoint = tmp_path / "ckpt"
    assert choice(tmp_path, str(checkpoint), hold="tasks") is None
    (checkpoint / SPOOL_FOLDER).mkdir(parents=True)
    with pa.OSFile(str(checkpoint / SPOOL_FOLDER / f"{7:019d}-left.arrow"), "wb") as f:
        f.write(b"")   # its contents are the hold's to read at start; here only its name counts
    hold = choice(tmp_path, str(checkpoint), hold="tasks")
    try:
        assert isinstance(hold, DriverHold), "a leftover spool is still sent"
    finally:
        hold.stop()
