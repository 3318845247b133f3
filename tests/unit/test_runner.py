"""`streaming.runner.wait` against a stand-in job (no JVM): a query that died because an
executor took a batch's kept rows with it is started again; any other failure ends the run."""
import threading

import pytest

from streaming import runner


class Failure(Exception):
    """As PySpark hands a JVM error over: its description and stack trace as text."""

    def __init__(self, desc: str):
        super().__init__(desc)
        self._desc, self._stackTrace, self._cause = desc, "", None


class Query:
    def __init__(self, failure):
        self.isActive, self._failure = False, failure

    def exception(self):
        return self._failure


class Job:
    def __init__(self, failures, stop):
        self.failures, self.stop, self.restarts = list(failures), stop, 0
        self.query = Query(self.failures.pop(0))

    def restart(self):
        self.restarts += 1
        if self.failures:
            self.query = Query(self.failures.pop(0))
        else:   # started again and running: the test's stop ends the wait
            self.query.isActive = True
            self.stop.set()


LOST = "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_99_1 not found!"


def test_a_batch_s_kept_rows_lost_with_an_executor_start_the_job_again():
    stop = threading.Event()
    job = Job([Failure(LOST)], stop)
    runner.wait(job, stop, poll_s=0.01)
    assert job.restarts == 1


def test_other_failures_end_the_run_and_restarts_are_bounded():
    stop = threading.Event()
    other = Failure("[STREAM_FAILED] something else")
    with pytest.raises(Failure, match="something else"):
        runner.wait(Job([other], stop), stop, poll_s=0.01)
    job = Job([Failure(LOST)] * (runner.RESTARTS + 1), stop)
    with pytest.raises(Failure, match="CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"):
        runner.wait(job, stop, poll_s=0.01)
    assert job.restarts == runner.RESTARTS
