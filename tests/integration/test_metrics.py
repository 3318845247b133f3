"""Metrics against a real Prometheus server: every dashboard query returns data, and the
delivered and pending figures agree with what the test sent and consumed."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from sinks.metrics import build_metrics
from streaming.producer import DelayProducer
from tests.conftest import PROJECT
from tests.support import assert_eventually, consume_all, free_port

DASHBOARD = PROJECT / "deploy" / "grafana" / "dashboards" / "delayq.json"


@pytest.fixture
def prometheus(work_dir):
    """Factory: a Prometheus server on loopback scraping the given target every second."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed; deploy/setup.sh installs Debian's package"
    procs = []

    def start(target: str) -> str:
        port = free_port()
        home = work_dir / f"prometheus-{port}"
        home.mkdir()
        (home / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: delayq\n    static_configs:\n"
            f"      - targets: ['{target}']\n")
        proc = subprocess.Popen(
            [binary, f"--config.file={home / 'prometheus.yml'}",
             f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=open(home / "log", "w"), stderr=subprocess.STDOUT)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200
            except OSError:
                return False
        assert_eventually(ready, timeout_s=60, message="prometheus ready")
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def query(url: str, expr: str) -> list:
    q = urllib.parse.urlencode({"query": expr})
    body = json.load(urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10))
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(url: str, expr: str) -> float | None:
    result = query(url, expr)
    return float(result[0]["value"][1]) if result else None


def test_dashboard_queries_return_data_and_figures_agree(job_settings, start_job, new_topic,
                                                          kafka_bootstrap, prometheus):
    from prometheus_client import start_http_server

    settings = job_settings(delay_levels="1s 2s 60s", metrics_port=free_port())
    metrics = build_metrics()
    server, _ = start_http_server(settings.metrics_port, addr="127.0.0.1",
                                  registry=metrics.registry)
    try:
        url = prometheus(f"127.0.0.1:{settings.metrics_port}")
        real = new_topic(message_timestamp_type="LogAppendTime")
        start_job(settings, metrics=metrics)
        with DelayProducer(settings) as producer:
            for level in (0, 1, 1, 2, 2, 2):
                producer.send(real, b"due soon", level=level)
            for _ in range(4):
                producer.send(real, b"pending", level=3)
            producer.send("no-such-topic", b"dead", level=1)
        consume_all(kafka_bootstrap, real, expected=6, timeout_s=60)

        assert_eventually(lambda: scalar(url, "sum(delayq_messages_delivered_total)") == 6,
                          timeout_s=60, message="Prometheus sees 6 delivered")
        # The ledger query counts deliveries once sent; a batch's own figures (received,
        # pending, dead-lettered) are counted once its sinks are done, which on a slow host (the
        # dead-letter table's first Delta commit) can come after the last delivery.
        assert_eventually(lambda: scalar(url, "sum(delayq_messages_received_total)") == 11,
                          timeout_s=60, message="Prometheus sees 11 received")
        # The message to a missing topic is pending until its dispatch task gives up waiting for
        # the topic (dispatch_topic_wait_ms) and dead-letters it.
        assert_eventually(lambda: scalar(url, 'delayq_messages_dead_lettered_total'
                                              '{reason="unknown_topic"}') == 1,
                          timeout_s=60, message="Prometheus sees the dead letter")
        assert_eventually(lambda: scalar(url, "sum(delayq_pending_messages)") == 4,
                          timeout_s=30, message="Prometheus sees 4 pending")
        assert scalar(url, 'delayq_pending_messages{level="3"}') == 4
        assert scalar(url, "sum(delayq_messages_received_total)") == 11
        assert scalar(url, 'delayq_delivery_lateness_seconds_count') == 6

        # `delayq status` reads the same endpoint.
        from streaming.cli.status import fetch, render
        headline = render(fetch(f"http://127.0.0.1:{settings.metrics_port}/metrics"))
        assert "received 11   delivered 6   dead-lettered 1" in headline

        time.sleep(3)  # two more scrapes, so every rate() has two samples in its window
        exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
        assert len(exprs) >= 10
        empty = [e for e in exprs if not query(url, e)]
        assert not empty, f"dashboard queries without data: {empty}"
    finally:
        server.shutdown()


def test_pending_gauge_after_a_restart_counts_every_message_once(job_settings, start_job,
                                                                new_topic, kafka_bootstrap,
                                                                work_dir):
    """The restarted job's gauge is the state as of the last committed batch plus the deltas
    of its own batches, whichever comes first (the state is read after the first batch)."""
    settings = job_settings(delay_levels="1s 2s 60s")
    real = new_topic(message_timestamp_type="LogAppendTime")
    checkpoint = str(work_dir / f"ckpt-{settings.intake_topic}")

    def pending(metrics, level):
        return metrics.registry.get_sample_value("delayq_pending_messages", {"level": str(level)})

    first = build_metrics()
    job = start_job(settings, checkpoint=checkpoint, metrics=first)
    with DelayProducer(settings) as producer:
        for _ in range(4):
            producer.send(real, b"held", level=3)
    assert_eventually(lambda: pending(first, 3) == 4, timeout_s=60, message="4 pending")
    job.stop()

    with DelayProducer(settings) as producer:   # while the job is away
        for _ in range(2):
            producer.send(real, b"held", level=3)
        producer.send(real, b"due", level=1)
    second = build_metrics()
    job = start_job(settings, checkpoint=checkpoint, metrics=second)
    consume_all(kafka_bootstrap, real, expected=1, timeout_s=60)
    # Level 1's message is a dispatch task's own (streaming/dispatch/direct.py): its level shows in the
    # gauge only if a commit caught it held.
    assert_eventually(lambda: pending(second, 3) == 6 and not pending(second, 1),
                      timeout_s=60, message="6 pending at level 3, none at level 1")
    job._seeder.join(timeout=60)
    assert not job._seeder.is_alive()
    time.sleep(2)   # a few more (heartbeat) batches: nothing counted twice
    assert (pending(second, 3), pending(second, 1) or 0) == (6, 0)


def test_exported_metrics_pass_promtool(job_settings):
    from prometheus_client import generate_latest

    from sinks.base import BatchSummary

    metrics = build_metrics()
    summary = BatchSummary(1)
    summary.add("deliver", 2, None, 3)
    summary.add("dead", 0, "header REAL_TOPIC is missing", 1)
    summary.add("tally", 2, None, 1, received=4, pending_delta=1)
    summary.lateness = ([0] * 5 + [3] * 11, 3, 0.9)
    metrics.observe_batch(summary)
    text = generate_latest(metrics.registry)
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (deploy/setup.sh)"
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
