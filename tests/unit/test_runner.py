"""`streaming.runner.wait` against a stand-in job (no JVM): a query that died because an
executor took a batch's kept rows with it is started again; any other failure ends the run."""
import threading

import pytest

from conf import load_settings
from streaming import runner


class Failure(Exception):
    """As PySpark hands a JVM error over: a captured exception with its Spark error condition
    and its cause."""

    def __init__(self, desc: str, condition: str | None = None, cause=None):
        super().__init__(desc)
        self._desc, self._stackTrace, self._cause = desc, "", cause
        self._condition = condition

    def getCondition(self):   # noqa: N802 (PySpark's name)
        return self._condition


class Query:
    def __init__(self, failure):
        self.isActive, self._failure = False, failure

    def exception(self):
        return self._failure


class Job:
    """Failures: (the query's exception, whether its batch writer saw its kept rows lost)."""

    def __init__(self, failures, stop, restarts=3):
        self.failures, self.stop, self.restarts = list(failures), stop, 0
        self.settings = load_settings(job_restarts=restarts)
        self._next()

    def _next(self):
        failure, self._lost = self.failures.pop(0)
        self.query = Query(failure)

    def lost_kept_rows(self):
        return self._lost

    def restart(self):
        self.restarts += 1
        if self.failures:
            self._next()
        else:   # started again and running: the test's stop ends the wait
            self.query.isActive = True
            self.stop.set()


# As the query reports a failed foreachBatch: the writer's error as the text of a traceback.
LOST = Failure("[FOREACH_BATCH_USER_FUNCTION_ERROR] ... Traceback ... CHECKPOINT_RDD_BLOCK_ID")


def test_a_batch_s_kept_rows_lost_with_an_executor_start_the_job_again():
    stop = threading.Event()
    job = Job([(LOST, True)], stop)
    runner.wait(job, stop, poll_s=0.01)
    assert job.restarts == 1


def test_other_failures_end_the_run_and_restarts_are_bounded():
    stop = threading.Event()
    other = Failure("something else")
    with pytest.raises(Failure, match="something else"):
        runner.wait(Job([(other, False)], stop), stop, poll_s=0.01)
    job = Job([(LOST, True)] * 3, stop, restarts=2)   # the setting job_restarts bounds them
    with pytest.raises(Failure, match="FOREACH_BATCH"):
        runner.wait(job, stop, poll_s=0.01)
    assert job.restarts == 2


class Throwable:
    """A JVM throwable as py4j shows it: a condition when it is a SparkThrowable, a cause."""

    def __init__(self, condition=None, cause=None):
        self._condition, self._cause = condition, cause

    def getCondition(self):   # noqa: N802 (the JVM's names)
        if self._condition is None:
            raise AttributeError("no SparkThrowable")
        return self._condition

    def getCause(self):   # noqa: N802
        return self._cause


def test_the_error_conditions_are_read_along_the_causes():
    from streaming.wheel.writer import LOST_KEPT_ROWS, error_conditions

    class Py4JJavaError(Exception):
        def __init__(self, java_exception):
            self.java_exception = java_exception

    aborted = Py4JJavaError(Throwable(None, Throwable("STAGE_FAILED", Throwable(LOST_KEPT_ROWS))))
    assert error_conditions(aborted) == {"STAGE_FAILED", LOST_KEPT_ROWS}
    assert error_conditions(Failure("job aborted", LOST_KEPT_ROWS)) == {LOST_KEPT_ROWS}   # converted
    assert error_conditions(ValueError("x")) == set()
