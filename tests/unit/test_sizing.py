"""Partitions sized for the cluster (streaming/wheel/sizing.py): the slots the job was given, the
split between dispatch tasks and the wheel's state, and a checkpoint keeping its own."""
import json

from conf import load_settings
from streaming.wheel import sizing
def test_the_slots_are_the_cores_the_job_was_given():
    assert sizing.task_slots({"spark.cores.max": "8"}, 2) == 8
    assert sizing.task_slots({"spark.executor.instances": "3", "spark.executor.cores": "4"}, 2) == 12
    assert sizing.task_slots({}, 6) == 6


def test_the_dispatch_tasks_get_a_quarter_of_the_slots_and_one_is_spare():
    assert sizing.sized(8) == (5, 2)
    assert sizing.sized(16) == (11, 4)
    for slots in range(4, 64):
        state, ready = sizing.sized(slots)
        assert state + ready + 1 == slots and state >= 1 and ready >= 2


def test_a_new_checkpoint_is_sized_and_a_resumed_one_keeps_its_partitions(tmp_path):
    auto = load_settings(spark_shuffle_partitions=0, ready_partitions=0)
    fresh = sizing.resolve(auto, tmp_path / "ckpt", slots=12)
    assert (fresh.spark_shuffle_partitions, fresh.ready_partitions) == (8, 3)
    offsets = tmp_path / "ckpt" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "4").write_text("v1\n" + json.dumps(
        {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": "5"}}) + "\n{}\n")
    resumed = sizing.resolve(auto, tmp_path / "ckpt", slots=12)
    assert resumed.spark_shuffle_partitions == 5, "Spark's record in the checkpoint wins"
    chosen = load_settings(spark_shuffle_partitions=3, ready_partitions=2)
    assert sizing.resolve(chosen, tmp_path / "ckpt", slots=12) is chosen
