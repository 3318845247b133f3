"""The job is killed (SIGKILL, driver and JVM) at random moments under steady load and
restarted from its checkpoint: every message is delivered, none early, none twice for a
read_committed reader (delivery = "exactly_once", the default; with "at_least_once" duplicates
only with the same UNIQ_KEY), and the ledger holds every delivered message exactly once. And a
dispatch task's worker paused under load is replaced and fenced."""
from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import pytest

from sinks import store
from streaming.kafka.admin import admin_client, create_topic
from tests.faults.conftest import (SteadyLoad, check_all_delivered, check_late,
                                   check_ledgered_once, ledger_senders, real_topic)
from tests.support import assert_eventually, delta_rows, s3_client

KILLS = 2


@pytest.mark.parametrize("where", ["local", "s3", "hdfs-at_least_once"])
def test_kill_and_restart_loses_nothing_and_ledger_is_exact(job_process, spark, capsys, where,
                                                            request):
    """The wheel, the dispatch tasks and the ledger query killed together, with the checkpoints
    and tables in a local folder, on a real S3 server (`store`), or on a real HDFS without the
    dispatch tasks' transactions."""
    options = {"ledger_interval": "2s"}
    exactly = not where.endswith("at_least_once")
    if not exactly:
        options["delivery"] = "at_least_once"
    if where.startswith("hdfs"):
        options["store"] = f"{request.getfixturevalue('hdfs_uri')}/kill-{uuid.uuid4().hex[:8]}"
    if where == "s3":
        options.update(request.getfixturevalue("s3_store"),
                       store=f"s3a://delayq/kill-{uuid.uuid4().hex[:8]}")
    on_store = where != "local"
    job, settings = job_process(**options)
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start()

    load = SteadyLoad(settings, real)
    load.start()
    rng = random.Random(7)
    for _ in range(1 if on_store else KILLS):   # a store's path once is enough
        time.sleep(rng.uniform(4, 10))
        job.kill()
        time.sleep(rng.uniform(0, 3))
        job.start()
    time.sleep(5)
    load.stop()
    sent = load.sent

    outcome = check_all_delivered(settings, real, sent)
    twice = outcome.twice()
    assert not twice or not exactly, (f"{len(twice)} read twice, by level (-1 a timer): "
                                      f"{sorted(load.level_of.get(u) for u in twice)}")
    # The ledger is written after Kafka in each batch: let the last batch finish first.
    assert_eventually(lambda: set(ledger_rows(spark, settings)) >= set(sent), timeout_s=60,
                      message="ledger rows for every delivered message")
    if where == "s3":   # Delta's S3 log store takes one writer: no upkeep while the job writes
        import subprocess
        import sys

        upkeep = subprocess.run([sys.executable, "-m", "streaming.cli.main", "tables", "maintain"],
                                cwd=Path(__file__).parents[2], env=job.env,
                                capture_output=True, text=True, timeout=180)
        assert upkeep.returncode == 2 and "one writer at a time: stop the job" in upkeep.stderr, \
            upkeep.stderr[-2000:]
    job.stop()
    assert settings.checkpoint_path.startswith(settings.store_root)
    if where == "s3":   # the test's Spark has no S3A: pyarrow's S3 client looks
        from pyarrow import fs

        commits = fs.FileSelector(settings.checkpoint_path.removeprefix("s3a://") + "/commits")
        assert s3_client(settings).get_file_info(commits), "Spark's commits on S3"
    else:
        assert (store.path(settings.checkpoint_path) / "commits").is_dir()

    per_key = ledger_rows(spark, settings)
    assert set(per_key) == set(sent), f"ledger misses {len(set(sent) - set(per_key))}"
    assert all(n == 1 for n in per_key.values()), "ledger rows must be exactly once"
    with capsys.disabled():
        print(f"\nkill test ({where}): {1 if on_store else KILLS} kill(s), {len(sent)} messages, lost 0, early 0, "
              f"duplicates in Kafka {outcome.duplicates}, ledger rows {len(per_key)} (exactly once)")


def ledger_rows(spark, settings) -> dict[str, int]:
    """The ledger's rows per UNIQ_KEY."""
    from collections import Counter

    return Counter(row["uniq_key"] for row in delta_rows(spark, settings, settings.ledger_path,
                                                         ["uniq_key"]))


def test_a_paused_dispatch_worker_is_replaced_and_what_it_sends_after_is_fenced(
        job_process, capsys):
    """The Python worker of ready partition 0's dispatch task paused (SIGSTOP) under load, as a
    long GC pause or a host cut off would: the driver sees its commits stop
    (dispatch_liveness_timeout), cancels it and starts a new task, whose producer fences the
    paused one; resumed (SIGCONT) if still there, it sends nothing a read_committed reader
    sees. Every message once, none early."""
    import os
    import signal

    job, settings = job_process(dispatch_liveness_timeout="8s")
    real = real_topic(settings)
    job.start()
    load = SteadyLoad(settings, real)
    load.start()

    senders = lambda: ledger_senders(settings, 0)

    paused = assert_eventually(lambda: (senders() or [None])[-1], timeout_s=60,
                               message="a delivery from ready partition 0")
    os.kill(paused, signal.SIGSTOP)
    took = time.monotonic()
    replaced = assert_eventually(lambda: set(senders()) - {paused}, timeout_s=90,
                                 message="ready partition 0's task started again")
    took = time.monotonic() - took
    try:
        os.kill(paused, signal.SIGCONT)
        fate = "resumed"
    except ProcessLookupError:
        fate = "gone (Spark killed the cancelled task's worker)"
    time.sleep(5)
    load.stop()
    assert job.proc.poll() is None, "the job went on"
    outcome = check_all_delivered(settings, real, load.sent, unacknowledged=load.unacknowledged)
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    assert "committed nothing for" in job.log.read_text()
    check_ledgered_once(settings, load)
    job.stop()
    with capsys.disabled():
        print(f"\npaused dispatch worker {paused}: replaced by {sorted(replaced)} {took:.1f} s "
              f"later, then {fate}; {len(load.sent)} messages, lost 0, early 0, read twice 0 "
              f"(read_committed); lateness max {max(outcome.lateness_ms)} ms")


# How long past the ledger's return (or its due time) a message may arrive: the task's restart
# back-off (up to 5 s by then), its start and its skip.
SKIP_LATE_MS = 20_000


def test_a_restart_whose_skip_cannot_read_the_whole_ledger_waits_and_sends_nothing_twice(
        job_process, capsys):
    """Ready partition 0's dispatch worker killed (SIGKILL) under load while a transaction of
    another producer is left open on its ledger partition, so a read_committed reader stops
    before the ledger rows committed after it: the restart's skip cannot read them, fails the
    task after dispatch_skip_deadline and is tried again after its back-off, never sending with
    a partial skip. Once that transaction is aborted, the task goes on: every message once
    (read_committed), none early, the partition's late ones bounded from the abort."""
    import os
    import signal

    from confluent_kafka import Producer

    job, settings = job_process(dispatch_skip_deadline="4s", dispatch_commit_interval_ms=30_000)
    real = real_topic(settings)
    job.start()
    load = SteadyLoad(settings, real)
    load.start()
    worker = assert_eventually(lambda: (ledger_senders(settings, 0) or [None])[-1],
                               timeout_s=60, message="a delivery from ready partition 0")
    time.sleep(3)   # rows in the ledger past the last offset commit, which the skip must read
    foreign = Producer({"bootstrap.servers": settings.bootstrap,   # open until aborted below
                        "transactional.id": f"foreign-{uuid.uuid4().hex[:8]}",
                        "transaction.timeout.ms": 300_000})
    foreign.init_transactions(30)
    foreign.begin_transaction()
    try:
        foreign.produce(settings.ledger_topic, b"left open", partition=0)
        foreign.flush(30)
        time.sleep(3)   # the task's own ledger rows, committed past the open transaction
        os.kill(worker, signal.SIGKILL)
        refused = "the restart's skip read ledger partition 0 only to offset"
        assert_eventually(lambda: refused in job.log.read_text(errors="replace"), timeout_s=60,
                          message="the restart's skip refused a partial read")
    finally:
        foreign.abort_transaction(30)
    open_ms = int(time.time() * 1000)
    assert_eventually(lambda: set(ledger_senders(settings, 0)) - {worker}, timeout_s=60,
                      message="ready partition 0's task sending again")
    time.sleep(5)
    load.stop()
    assert job.proc.poll() is None, "the job went on"
    outcome = check_all_delivered(settings, real, load.sent, unacknowledged=load.unacknowledged)
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    worst = check_late(outcome, load.sent, SKIP_LATE_MS, after_ms=open_ms)
    check_ledgered_once(settings, load)
    job.stop()
    with capsys.disabled():
        print(f"\nskip refused while ledger partition 0 had an open transaction: "
              f"{len(load.sent)} messages, lost 0, early 0, read twice 0 (read_committed); "
              f"{worst} ms at most after the due time or the abort")


@pytest.mark.parametrize("fault", ["credentials", "bucket"])
def test_a_store_on_s3_that_refuses_the_job_stops_its_start_with_the_fix(job_process, s3_store,
                                                                          fault):
    """Wrong credentials, or a bucket that does not exist, on a real S3 server: the start stops
    before anything is written, saying which and what to fix."""
    options = {**s3_store, "store": f"s3a://delayq/refused-{uuid.uuid4().hex[:8]}"}
    if fault == "credentials":
        options["s3_secret_key"] = "not-the-secret"
    else:
        options["store"] = "s3a://no-such-bucket/delayq"
    job, _ = job_process(**options)
    with pytest.raises(AssertionError, match="exited 2") as refused:
        job.start(timeout_s=120)
    said = {"credentials": "refused this job's credentials: check s3_access_key and s3_secret_key",
            "bucket": "its bucket does not exist"}[fault]
    assert said in str(refused.value)
