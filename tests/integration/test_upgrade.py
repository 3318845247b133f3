"""An upgrade with messages in flight: the delayq before the direct window for timers (`OLD`,
from this repository's history), which split timers to the wheel whatever their due time, is
stopped under load and this one started on its checkpoint. What the old dispatch tasks read
past and the old wheel had not read yet is taken once: nothing lost, early or twice."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from conf.settings import PROJECT_ROOT
from streaming.producer import DelayProducer
from streaming.tools.bench_load import stop_child, wait_for_line
from streaming.cli.arguments import STARTED
from tests.integration.conftest import Sent
from tests.support import check_deliveries, consume_all, free_ports

# The last commit whose split sent every timer through the wheel (and whose own records were
# not sealed): the version a running deployment upgrades from.
OLD = "7062ec9"
LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def old_delayq(tmp_path) -> str:
    """OLD's tree beside this one, with this one's jars."""
    tree = tmp_path / "old"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(PROJECT_ROOT), "archive", OLD],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / ".lib").symlink_to(PROJECT_ROOT / ".lib")
    return str(tree)


def test_timers_in_flight_across_the_upgrade_are_taken_once(
        job_settings, start_job, new_topic, kafka_bootstrap, tmp_path, lateness_log):
    # The old default's cold buckets, as docs/operations.md (Upgrades) says to resume with.
    settings = job_settings(dispatch_direct_max_delay_ms=12_000, cold_bucket="1h")
    real = new_topic(**LOG_APPEND)
    metrics, ui = free_ports(2)
    env = {**os.environ, **{f"DELAYQ_{k.upper()}": str(v) for k, v in dict(
        bootstrap_servers=kafka_bootstrap, data_dir=settings.data_path, cold_bucket="1h",
        intake_topic=settings.intake_topic, dlq_topic=settings.dlq_topic,
        delay_levels=settings.delay_levels, dispatch_direct_max_delay_ms=12_000,
        spark_shuffle_partitions=2, ledger_interval="10s", metrics_port=metrics,
        spark_ui_port=ui).items()}}
    log = tmp_path / "old.log"
    with log.open("wb") as out:
        old = subprocess.Popen([sys.executable, "-m", "streaming.cli.main", "run"],
                               cwd=old_delayq(tmp_path), env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    sent: dict = {}

    def send(producer, n: int, tag: str) -> None:
        """Timers of every length around the window, and short and long levels."""
        for i in range(n):
            kind = i % 4
            kwargs = ({"delay_ms": 500 + 997 * (i % 16)} if kind < 2 else
                      {"deliver_at_ms": int(time.time() * 1000) + 1_000 * (i % 14) - 2_000}
                      if kind == 2 else {"level": 1 + i % 3})
            h = producer.send(real, f"{tag}-{i}".encode(), **kwargs)
            sent[h.uniq_key] = Sent(None, f"{tag}-{i}".encode(), [], h.due_ms)

    try:
        wait_for_line(old, log, STARTED, timeout_s=240)
        with DelayProducer(settings) as producer:
            send(producer, 120, "old")
            stopping = time.monotonic()
            old.terminate()   # a clean stop, under load: its tasks read on as its wheel stops
            while old.poll() is None and time.monotonic() - stopping < 90:
                send(producer, 8, f"stopping-{int(time.monotonic() * 1000)}")
            assert old.wait(30) == 0, log.read_text()[-3000:]
            send(producer, 40, "down")
        start_job(settings, checkpoint=str(settings.checkpoint_path))
        up_ms = int(time.time() * 1000)
        with DelayProducer(settings) as producer:
            send(producer, 80, "new")
    finally:
        stop_child(old)
    records = consume_all(kafka_bootstrap, real, expected=len(sent), timeout_s=90, idle_s=5)
    check_deliveries(records, sent, late_ms=10_000, after_ms=up_ms)   # read_committed
    dead = consume_all(kafka_bootstrap, settings.dlq_topic, expected=0, idle_s=1)
    assert not dead, [dict(r.headers).get("DLQ_REASON") for r in dead[:3]]
