"""Outages around the job: the broker stopped and started, or hung and resumed, under load; the
job stopped for longer than its messages' delays; its ledger table refusing writes. Nothing is
lost, nothing is early, nothing is read twice (read_committed)."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from streaming.tools import broker
from streaming.kafka.admin import admin_client, create_topic
from streaming.producer import DelayProducer
from tests.conftest import PROJECT
from tests.faults.conftest import (SteadyLoad, check_all_delivered, check_late,
                                   check_ledgered_once)
from tests.support import assert_eventually, free_ports, header_map

LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


@pytest.fixture
def own_broker(work_dir):
    """A broker of this test's own, so it can be stopped without stopping the others."""
    port, controller_port = free_ports(2)
    spec = broker.BrokerSpec(home=work_dir / f"kafka-{uuid.uuid4().hex[:6]}",
                             jars=PROJECT / ".lib" / "kafka", port=port,
                             controller_port=controller_port, heap="512m")
    broker.start(spec)
    yield spec
    broker.stop(spec)


def running_under_load(job, settings) -> tuple[str, SteadyLoad]:
    """A real topic of two partitions, the job started, a steady load sent to it."""
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, LOG_APPEND)
    admin.close()
    job.start()
    load = SteadyLoad(settings, real, interval_s=0.05)
    load.start()
    return real, load


# After a broker outage, how long past its end (or its due time) a message may arrive: the
# clients reconnect, open transactions abort and are sent again.
OUTAGE_LATE_MS = 20_000


@pytest.mark.parametrize("fault", ["stopped", "paused"])
def test_broker_stopped_or_hung_under_load_loses_nothing(own_broker, job_process, capsys, fault):
    """The broker stopped and started again 10 s later, or hung (SIGSTOP, as a network partition
    looks to a client: nothing answers, nothing refuses) for 20 s and resumed."""
    job, settings = job_process(bootstrap_servers=own_broker.bootstrap)
    real, load = running_under_load(job, settings)
    time.sleep(6)
    before = len(load.sent)
    down_at = time.time()
    if fault == "stopped":
        broker.stop(own_broker)
        time.sleep(10)
        broker.start(own_broker)
    else:
        pid = broker.read_pid(own_broker)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(20)
        finally:
            os.kill(pid, signal.SIGCONT)
    up_ms = int(time.time() * 1000)
    down_s = up_ms / 1000 - down_at
    time.sleep(8)
    load.stop()
    assert job.proc.poll() is None, f"the job died with the broker:\n{job.log.read_text()[-3000:]}"
    assert len(load.sent) > before, "the producer got through after the restart"
    try:
        outcome = check_all_delivered(settings, real, load.sent,
                                      unacknowledged=load.unacknowledged)
        worst = check_late(outcome, load.sent, OUTAGE_LATE_MS, after_ms=up_ms)
    except AssertionError as e:   # what the job did meanwhile, for the one who reads the failure
        raise AssertionError(f"{e}\n\nthe job's log, its end:\n"
                             f"{job.log.read_text(errors='replace')[-8000:]}") from None
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    check_ledgered_once(settings, load)
    job.stop()
    # The outage in the job's log in delayq's words, not kafka-python's lines, several a second.
    said = job.log.read_text(errors="replace")
    assert " kafka." not in said, [line for line in said.splitlines() if " kafka." in line][:5]
    assert said.count("could not commit the intake's offsets") <= 1, said[-3000:]
    with capsys.disabled():
        print(f"\nbroker {fault}: {down_s:.1f} s, {len(load.sent)} messages, lost 0, early 0, "
              f"duplicates {outcome.duplicates}, max lateness {max(outcome.lateness_ms)} ms, "
              f"{worst} ms at most after the due time or the broker's return; sends refused or "
              f"unacknowledged meanwhile {load.failed}")


def test_job_stopped_longer_than_the_delays_delivers_overdue_at_once_in_due_order(
        job_process, spark, capsys):
    """Stopped cleanly with messages pending, away longer than their delays, started again (in
    the other delivery mode): the overdue ones go at once, in due order, each once, and the
    ledger counts them late."""
    # Delays longer than a clean stop takes (CI's took over 3.5 s once: its messages, then due
    # in 1 to 3 s, all left before it ended); level 1 the dispatch tasks' own way, 2 and 3 the
    # wheel's.
    job, settings = job_process(delay_levels="6s 7s 8s", dispatch_direct_max_delay_ms=6000)
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 1, LOG_APPEND)
    admin.close()
    job.start()
    sent: dict[str, int] = {}
    level_of: dict[str, int] = {}
    with DelayProducer(settings) as producer:
        for i in range(60):
            # REAL_QID named: due order is kept per named partition (and per key)
            handle = producer.send(real, f"m{i}".encode(), level=1 + i % 3, partition=0)
            sent[handle.uniq_key], level_of[handle.uniq_key] = handle.due_ms, handle.level
    stopping_at = int(time.time() * 1000)
    job.stop()  # SIGTERM: a clean stop, with messages due in 6, 7 and 8 s still pending
    stopped_at = int(time.time() * 1000)
    time.sleep(10)   # away past every due time
    restarting_at = int(time.time() * 1000)
    # Started again delivering at least once (exactly once before): a switch after a clean stop
    # keeps the checkpoint, the committed offsets and the ledger (docs/operations.md).
    job.env["DELAYQ_DELIVERY"] = "at_least_once"
    job.start()
    assert job.log.read_text().split("==== start 2")[1].count("delivery at_least_once") == 1
    restarted_at = int(time.time() * 1000)
    overdue = {k for k, due in sent.items() if due < restarting_at}
    outcome = check_all_delivered(settings, real, sent, timeout_s=120)
    assert outcome.duplicates == 0, "a clean stop sends nothing twice"

    first: dict[str, object] = {}
    for record in sorted(outcome.records, key=lambda r: r.offset):
        first.setdefault(header_map(record)["UNIQ_KEY"].decode(), record)
    # From the moment the job starts again: the dispatch tasks send what the ready topic held
    # over the stop as they start.
    after = [r for r in first.values() if r.timestamp >= restarting_at]
    assert after, (f"messages held over the stop were delivered after the restart (the stop "
                   f"took {stopped_at - stopping_at} ms)")
    for level in (1, 2, 3):
        dues = [sent[header_map(r)["UNIQ_KEY"].decode()] for r in sorted(after, key=lambda r: r.offset)
                if level_of[header_map(r)["UNIQ_KEY"].decode()] == level]
        assert dues == sorted(dues), f"level {level} delivered out of due order"
    held = [k for k, r in first.items() if r.timestamp >= restarting_at and k in overdue]
    # The ledger counts each overdue delivery as late, by at least the time the job was away.
    ledger = assert_eventually(
        lambda: (lambda rows: rows if len(rows) >= len(sent) else None)(
            {r["uniq_key"]: r["lateness_ms"] for r in spark.read.format("delta")
             .load(str(settings.ledger_path)).select("uniq_key", "lateness_ms").collect()}),
        timeout_s=60, message="ledger rows for every message")
    job.stop()
    for key in held:
        assert ledger[key] >= restarting_at - sent[key] - 1000 > 0, (key, ledger[key])
    with capsys.disabled():
        lateness = sorted(ledger[k] for k in held)
        print(f"\njob away {(restarted_at - stopped_at) / 1000:.1f} s (stop to ready): {len(sent)} messages, "
              f"{len(held)} overdue at restart, delivered in due order per level, lateness of "
              f"those {lateness[0]}..{lateness[-1]} ms, lost 0, early 0, "
              f"duplicates {outcome.duplicates}")


def test_the_ledger_table_unwritable_stops_the_job_and_a_restart_after_the_fix_loses_nothing(
        job_process, spark, capsys):
    """The Delta ledger's log replaced by a file under load (a store that refuses its writes):
    the ledger query fails, and the job stops with the reason instead of running on with its
    ledger and delivery metrics silent. Started again once the log is back, it delivers every
    message once and the ledger holds a row for each, once."""
    from pathlib import Path

    job, settings = job_process()
    real, load = running_under_load(job, settings)
    log_dir = Path(settings.ledger_path) / "_delta_log"
    assert_eventually(lambda: log_dir.is_dir(), timeout_s=60, message="the ledger's first rows")
    moved = log_dir.with_name("_delta_log.moved")
    log_dir.rename(moved)
    log_dir.write_text("not a folder")
    assert_eventually(lambda: job.proc.poll() is not None, timeout_s=120,
                      message="the job stopped on its ledger query's failure")
    said = job.log.read_text(errors="replace")
    assert job.proc.returncode != 0 and "delayq: the ledger query stopped" in said, said[-3000:]
    log_dir.unlink()
    moved.rename(log_dir)
    job.start()
    time.sleep(5)
    load.stop()
    outcome = check_all_delivered(settings, real, load.sent, unacknowledged=load.unacknowledged)
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    ledger = lambda: [r["uniq_key"] for r in spark.read.format("delta")
                      .load(str(settings.ledger_path)).select("uniq_key").collect()]
    rows = assert_eventually(lambda: (keys := ledger()) and set(keys) >= set(load.sent) and keys,
                             timeout_s=60, message="ledger rows for every delivered message")
    assert len(rows) == len(set(rows)), "a message with two ledger rows"
    job.stop()
    with capsys.disabled():
        print(f"\nledger table unwritable: the job stopped with its reason; after the fix "
              f"{len(load.sent)} messages, lost 0, duplicates 0, ledger rows {len(rows)} once each")
