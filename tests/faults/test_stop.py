"""A stop sent to `delayq submit` (as Kubernetes sends one to the driver pod, whose
entrypoint runs spark-submit the same way) is the driver's clean stop: spark-submit's JVM
does not get it, the batch under way finishes, the process exits 0, and after the restart
nothing is sent twice."""
from __future__ import annotations

import time

from streaming.kafka.admin import admin_client, create_topic
from tests.faults.conftest import SteadyLoad, check_all_delivered


def test_a_sigterm_to_delayq_submit_is_a_clean_stop(job_process, capsys):
    job, settings = job_process(command=["submit", "--master", "local[6]"])
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start(timeout_s=300)
    load = SteadyLoad(settings, real, levels=(0, 1, 2, 3), interval_s=0.01)
    load.start()
    time.sleep(8)
    asked = time.monotonic()
    job.stop()   # SIGTERM to the `delayq submit` process alone, while the load goes on
    took = time.monotonic() - asked
    log = job.log.read_text(errors="replace").split("==== start 1 ====")[-1]
    assert job.proc.returncode == 0, \
        f"exit code {job.proc.returncode}:\n{errors_in(log)}\n{job.stuck}"
    assert "stopping the driver" in log and "delayq stopped" in log, log[-3000:]
    # The driver's JVM, started by spark-submit, has the project's log4j2 configuration.
    assert "was locally checkpointed" not in log
    time.sleep(2)
    load.stop()
    job.start(timeout_s=300)
    outcome = check_all_delivered(settings, real, load.sent, timeout_s=180,
                                  unacknowledged=load.unacknowledged)
    job.stop()
    assert outcome.duplicates == 0, "a clean stop sends nothing twice"
    with capsys.disabled():
        print(f"\ndelayq submit stopped by SIGTERM under load: stop took {took:.1f} s, exit 0, "
              f"{len(load.sent)} messages, lost 0, early 0, duplicates 0")


def test_a_sigterm_while_the_job_starts_is_a_clean_stop_once_it_is_up(job_process):
    """A stop that comes while `delayq run` is still starting (here: while its Spark session
    is being built) is not the end of the driver where it stands: the job finishes starting,
    then stops cleanly and exits 0."""
    import signal
    import subprocess
    import sys

    from tests.faults.conftest import PROJECT, descendants

    job, settings = job_process()
    with open(job.log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streaming.cli.main", *job.command],
                                cwd=PROJECT, env=job.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    job.proc = proc   # the fixture kills what is left at teardown
    deadline = time.monotonic() + 60
    while not any(is_java(pid) for pid in descendants(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, job.log.read_text()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)   # Spark's launcher JVM is up; the job is not
    returncode = proc.wait(timeout=240)
    log = job.log.read_text(errors="replace")
    assert returncode == 0, f"exit code {returncode}:\n{errors_in(log)}"
    assert "stop asked while starting" in log and "delayq stopped" in log, log[-3000:]
    assert log.index("stop asked while starting") < log.index("delayq running"), \
        "the signal came before the job was up"


def is_java(pid: int) -> bool:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/exe").resolve().name == "java"
    except OSError:
        return False


def errors_in(log: str, limit: int = 60) -> str:
    """The log's lines that say what went wrong (errors, exceptions, the stop's own lines, and
    the Python frames under a traceback), without the Java frames that bury them."""
    keep = [line for line in log.splitlines()
            if any(word in line for word in ("ERROR", "WARN", "Error", "Exception", "delayq",
                                             "File \"", "Caused by"))
            and not line.lstrip().startswith("at ")]
    return "\n".join(keep[-limit:])
