"""The dispatch stage's driver side over stand-ins of Spark (no JVM): the start refuses too few
task slots or speculation, and the supervisor gives up, saying why, once a partition's task
has failed more than `dispatch_max_failures` times."""
import pytest

from conf import load_settings
from state.errors import JobError
from streaming.wheel.sizing import check_slots
from streaming.dispatch.supervisor import Dispatcher
from streaming.stages import dispatch_config, rules_of, supervision_of


class Context:
    def __init__(self, slots=5, conf=None, fail=None):
        self.defaultParallelism, self._conf, self._fail = slots, conf or {}, fail
        self.groups = []

    def getConf(self):
        return self._conf

    def setJobGroup(self, group, description, interruptOnCancel=False):
        self.groups.append(group)

    def parallelize(self, items, slices):
        return self

    def mapPartitions(self, function):
        return self

    def collect(self):
        raise self._fail


class Spark:
    def __init__(self, context):
        self.sparkContext = context


def job_with(context):
    return Spark(context), load_settings(spark_shuffle_partitions=2, executor_slots_wait="1s")


def test_a_start_refuses_too_few_slots_and_speculation():
    check_slots(*job_with(Context(slots=5)), 2)
    with pytest.raises(JobError, match=r"needs 5 task slots .* Spark has 4"):
        check_slots(*job_with(Context(slots=4)), 2)
    with pytest.raises(JobError, match="spark.speculation must be off"):
        check_slots(*job_with(Context(conf={"spark.speculation": "true"})), 2)


def test_the_supervisor_gives_up_after_too_many_failures():
    context = Context(fail=RuntimeError("executor lost\nstack"))
    settings = load_settings(dispatch_max_failures=1)
    config = dispatch_config(settings, "run-1", 1_048_576, 1, {}, 1_048_588,
                             rules=rules_of(settings, ""))
    dispatcher = Dispatcher(Spark(context), config, supervision_of(settings))
    dispatcher._supervise(0)   # fails, waits its first back-off (1 s), fails again: gives up
    assert dispatcher.restarts == 1
    assert dispatcher.failure == ("dispatch of ready partition 0 failed 2 times in 600 s; "
                                  "last: executor lost")
    assert len(context.groups) == 2 and context.groups[0].endswith(".READY-0")


def test_a_task_s_own_error_is_said_not_spark_s_wrapping_of_it():
    from streaming.dispatch.supervisor import failure_reason

    wrapped = RuntimeError(
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ... "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "streaming/dispatch/rules.py", line 199, in observe\n'
        "state.errors.DispatchError: topic L stamps its records with the producer's clock\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException")
    assert failure_reason(wrapped) == "topic L stamps its records with the producer's clock"
    assert failure_reason(RuntimeError("executor lost\nstack")) == "executor lost"
