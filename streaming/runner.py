"""Run the service in this process: a Spark session and the delivery job with its Prometheus
endpoint, until Ctrl-C or SIGTERM."""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
from typing import Iterator

from conf.settings import Settings
from state.errors import JobError
from streaming.kafka import admin as kadmin
from streaming.job import DelayJob
from streaming.spark.session import STOPPING, build_session

log = logging.getLogger(__name__)


def process_age_s() -> float | None:
    """None where not known."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


# A stop takes at most the batch's grace and the thread's wait (30 s each) and Spark's stop;
# past this, every Python thread's stack is printed to say where it is stuck.
STOP_REPORT_S = 75


@contextlib.contextmanager
def running_job(settings: Settings, **job_args) -> Iterator[DelayJob]:
    from prometheus_client import start_http_server

    from sinks.metrics import build_metrics

    metrics = build_metrics()
    server, _ = start_http_server(settings.metrics_port, addr=settings.metrics_host,
                                  registry=metrics.registry)
    before = process_age_s()     # Python start-up, imports, settings, the exporter
    t0 = time.monotonic()
    STOPPING.clear()
    # A broker that does not answer is said in one line before Spark takes its seconds.
    kadmin.admin_client(settings).close()
    spark = build_session(settings)
    session_s = round(time.monotonic() - t0, 1)
    job = DelayJob(settings, spark, metrics=metrics, **job_args)
    try:
        job.start()
        job.startup_s = {**({"process": round(before, 1)} if before is not None else {}),
                         "spark_session": session_s, **job.startup_s}
        yield job
    finally:
        faulthandler.dump_traceback_later(STOP_REPORT_S)
        STOPPING.set()
        try:
            job.stop()
        finally:
            try:
                spark.stop()
            finally:
                server.shutdown()
                faulthandler.cancel_dump_traceback_later()


def stop_on_signals(stop: threading.Event, starting: bool = False) -> None:
    """SIGTERM and SIGINT set `stop`. While `starting`, only SIGTERM: it asks for the clean stop
    once the job is up, instead of ending the driver where it stands (SIGINT stays
    KeyboardInterrupt: the SparkContext sets its own)."""
    def handler(signum, frame):
        if starting and not stop.is_set():
            print("delayq: stop asked while starting; stopping once started", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    if not starting:
        signal.signal(signal.SIGINT, handler)


def wait(job: DelayJob, stop: threading.Event, poll_s: float = 1.0) -> None:
    """Block until stopped by a signal; raise the query's error if it dies. A query that died
    because an executor took a batch's kept rows with it is restarted up to `job_restarts` times."""
    stop_on_signals(stop)  # after the SparkContext, which installs a SIGINT handler of its own
    restarts, most = 0, job.settings.job_restarts
    while not stop.is_set():
        if not job.query.isActive:
            exc = job.query.exception()
            if exc is not None and restarts < most and job.lost_kept_rows():
                restarts += 1
                log.warning("a batch's kept rows were lost with an executor; starting the job "
                            "again from its checkpoint (%d of %d)", restarts, most)
                job.restart()
                continue
            if exc is not None:
                raise exc
            return
        failure = job.failure()
        if failure is not None:
            raise JobError(failure)
        stop.wait(poll_s)
