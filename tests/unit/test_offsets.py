import json

import pytest

from state.errors import JobError
from streaming.wheel.offsets import delay_offset_table


def write_batch(root, batch, offsets, committed=True):
    (root / "offsets").mkdir(exist_ok=True)
    (root / "commits").mkdir(exist_ok=True)
    (root / "offsets" / str(batch)).write_text(
        "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offsets) + "\n")
    if committed:
        (root / "commits" / str(batch)).write_text("v1\n{}\n")


def test_offset_table_is_last_committed_batch_per_level(tmp_path):
    write_batch(tmp_path, 0, {"SCHEDULE_TOPIC_XXXX": {"0": 1, "2": 5}})
    write_batch(tmp_path, 1, {"SCHEDULE_TOPIC_XXXX": {"0": 2, "2": 17}})
    write_batch(tmp_path, 2, {"SCHEDULE_TOPIC_XXXX": {"0": 9, "2": 99}}, committed=False)
    assert delay_offset_table(tmp_path, "SCHEDULE_TOPIC_XXXX") == {"offsetTable": {"1": 2, "3": 17}}


def test_the_heartbeats_partition_is_left_out(tmp_path):
    write_batch(tmp_path, 0, {"T": {"0": 3, "1": 0, "2": 40, "3": 8}})
    assert delay_offset_table(tmp_path, "T", heartbeats=2) == {
        "offsetTable": {"1": 3, "2": 0, "4": 8}}, "a partition added for a busy level stays"
    assert delay_offset_table(tmp_path, "T")["offsetTable"]["3"] == 40


def test_no_committed_batch_yet(tmp_path):
    write_batch(tmp_path, 0, {"T": {"0": 1}}, committed=False)
    assert delay_offset_table(tmp_path, "T") == {"offsetTable": {}}


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(JobError, match="not a delayq checkpoint"):
        delay_offset_table(tmp_path, "T")
