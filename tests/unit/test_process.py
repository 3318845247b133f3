"""Killing a job's whole process session, as the restart scenario and the fault tests do."""
import subprocess
import sys
import time

from streaming.tools.process import kill_session, pid_alive, session_pids


def test_kill_session_takes_the_child_that_would_outlive_its_parent():
    """A parent that started a child (as the driver's Python starts the Spark JVM): both are
    gone when kill_session returns, not just the parent."""
    job = subprocess.Popen([sys.executable, "-c",
                            "import subprocess, sys, time; "
                            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                            "time.sleep(60)"], start_new_session=True)
    deadline = time.monotonic() + 20
    while len(session_pids(job.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = session_pids(job.pid)
    assert job.pid in members and len(members) == 2
    kill_session(job)
    assert job.returncode == -9
    assert not any(pid_alive(pid) for pid in members)


def test_kill_session_of_a_job_already_gone_returns():
    job = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    job.wait(20)
    kill_session(job)
    assert job.returncode == 0
