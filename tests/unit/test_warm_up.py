"""The Python workers' warm-up job (streaming/job.py `DelayJob._warm_python_workers`) over a
stand-in of the Spark session, no JVM: one task per core running `state.worker.warm`, under
its own job group; a failure is logged, never raised, since the query starts its workers
itself (the real job: tests/integration/test_workers.py)."""
import logging

from conf import load_settings
from state.worker import warm
from streaming.job import WARM_UP_GROUP, DelayJob


class Frame:
    def __init__(self, spark, fail):
        self.spark, self.fail = spark, fail

    def mapInArrow(self, function, schema):
        self.spark.calls.append(("mapInArrow", function, schema))
        return self

    def collect(self):
        if self.fail:
            raise RuntimeError("Python worker exited unexpectedly")
        return []


class Spark:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail
        self.sparkContext = self
        self.defaultParallelism = 2

    def setJobGroup(self, group, description):
        self.calls.append(("group", group))

    def range(self, *args):
        self.calls.append(("range", args))
        return Frame(self, self.fail)


def warm_up(tmp_path, spark):
    job = DelayJob(load_settings(data_dir=tmp_path / "data", bootstrap_servers="127.0.0.1:1"),
                   spark=spark, checkpoint=str(tmp_path / "ckpt"), sinks=[])
    job._warm_python_workers()


def test_the_warm_up_runs_one_task_per_core_under_its_job_group(tmp_path, caplog):
    spark = Spark()
    with caplog.at_level(logging.INFO, logger="streaming.job"):
        warm_up(tmp_path, spark)
    assert spark.calls == [("group", WARM_UP_GROUP), ("range", (0, 2, 1, 2)),
                           ("mapInArrow", warm, "id long")]
    assert "Python workers started in" in caplog.text


def test_a_failed_warm_up_is_logged_and_never_raised(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="streaming.job"):
        warm_up(tmp_path, Spark(fail=True))
    assert "the Python workers' warm-up failed: Python worker exited unexpectedly" in caplog.text
    assert "Python workers started in" not in caplog.text
