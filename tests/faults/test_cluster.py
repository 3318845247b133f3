"""The cluster path: a real Spark standalone cluster (one Master, two Workers, on loopback),
the job submitted with `delayq submit` (code shipped as a zip, jars with --jars), the store on
HDFS, a mixed load and timers delivered on time and completely, and one Worker killed (with its
executor, like a lost host) while messages are pending: nothing lost, nothing early. And an
executor paused whole under load: its dispatch task is replaced and fenced."""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from streaming.tools import bench_cluster, cluster, process
from streaming.tools.bench_cluster import deliveries_by_sender
from streaming.kafka.admin import admin_client, create_topic
from streaming.producer import DelayProducer
from tests.faults.conftest import SteadyLoad, check_all_delivered
from tests.support import assert_eventually, free_ports


@pytest.fixture
def local_cluster(work_dir, request):
    """Two Workers of three cores each (`indirect` parameter: another core count)."""
    port, webui_port = free_ports(2)
    spec = cluster.ClusterSpec(home=work_dir / f"spark-cluster-{uuid.uuid4().hex[:6]}",
                               port=port, webui_port=webui_port, workers=2,
                               worker_cores=getattr(request, "param", 3), worker_memory="1g")
    cluster.start(spec)
    yield spec
    cluster.stop(spec)


def why_it_died(log: str) -> str:
    """The job log's first error lines and its end: the end alone is a failed query's plan."""
    errors = [line for line in log.splitlines()
              if "Exception" in line or "Error" in line or "Caused by" in line]
    return "\n".join(errors[:40]) + "\n...\n" + log[-1500:]


@pytest.mark.parametrize("local_cluster", [4], indirect=True)
def test_on_a_cluster_every_delivery_leaves_from_an_executor_and_a_lost_worker_loses_nothing(
        local_cluster, hdfs_uri, job_process, capsys):
    """The job on two Workers of four task slots each, the checkpoints and tables
    on HDFS, the partitions sized for the cluster by `delayq submit`: the ledger topic's records name the process that sent each delivery, every one an
    executor's (its working folder is in a Worker's), none the driver's. One Worker killed
    with its executor under load, timers pending in the wheel: its dispatch tasks start again
    on the other, 0 lost, 0 early."""
    spec = local_cluster
    job, settings = job_process(
        command=["submit", "--master", spec.master_url, "--total-executor-cores", "8"],
        spark_master=spec.master_url, spark_executor_memory="768m",
        ledger_interval="2s", store=f"{hdfs_uri}/cluster-{uuid.uuid4().hex[:8]}")
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 2, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start(timeout_s=300)
    # Partitions left unset: `delayq submit` has the new checkpoint sized for the 8 slots.
    assert "sized for 8 task slots: 5 wheel state partitions, 2 ready partitions" in \
        job.log.read_text()
    load = SteadyLoad(settings, real, levels=(0, 1, 2, 3), interval_s=0.05)
    load.start()
    timers: dict[str, int] = {}   # pending in the wheel's state as the worker goes
    with DelayProducer(settings) as producer:
        for i in range(10):
            handle = producer.send(real, f"t{i}".encode(), delay_ms=14_000 + 1_000 * i)
            timers[handle.uniq_key] = handle.due_ms
    time.sleep(15)
    os.killpg(process.read_pid(spec.pid_file("worker-2")), signal.SIGKILL)
    time.sleep(15)
    load.stop()
    assert job.proc.poll() is None, f"the job died with a worker:\n{why_it_died(job.log.read_text())}"
    sent = {**load.sent, **timers}
    outcome = check_all_delivered(settings, real, sent, timeout_s=240)
    def all_ledgered():
        got = deliveries_by_sender(settings, settings.ledger_topic)
        return got if sum(got.values()) >= len(sent) else None
    senders = assert_eventually(all_ledgered, timeout_s=120,
                                message="a ledger row for every delivery")
    job.stop()
    per_executor = bench_cluster.per_executor(senders, spec.home)
    assert "driver" not in per_executor, f"deliveries sent from outside the executors: {senders}"
    with capsys.disabled():
        print(f"\non a standalone cluster (2 workers x 4 slots, store on HDFS): "
              f"{len(sent)} messages, worker-2 killed 15 s into the load, lost 0, early 0, "
              f"duplicates {outcome.duplicates}, lateness max {max(outcome.lateness_ms)} ms; "
              f"deliveries per executor {per_executor}, from the driver 0")



@pytest.mark.parametrize("local_cluster", [4], indirect=True)
def test_on_a_cluster_a_paused_executor_s_dispatch_task_is_replaced_and_fenced(
        local_cluster, job_process, capsys):
    """The executor running ready partition 0's dispatch task paused whole (SIGSTOP to its JVM
    and Python workers: a long GC pause, a host cut off) under load: the driver sees the task's
    commits stop (dispatch_liveness_timeout), cancels it and starts it again, and, the paused
    executor not reporting the cancel (dispatch_kill_timeout), has Spark kill and replace it:
    its task slots, and those of micro-batch tasks waiting on it, would otherwise stay taken for
    spark.network.timeout (120 s), the new task's among them when it lands there. The new task's
    producer fences the paused one, which, resumed (SIGCONT) with the kill pending, sends nothing
    a read_committed reader sees: every message once, none early, none lost."""
    from tests.faults.conftest import (check_ledgered_once, descendants, ledger_senders,
                                       real_topic)

    spec = local_cluster
    job, settings = job_process(
        command=["submit", "--master", spec.master_url, "--total-executor-cores", "8"],
        spark_master=spec.master_url, spark_executor_memory="768m",
        dispatch_liveness_timeout="8s", dispatch_kill_timeout="5s")
    real = real_topic(settings)
    job.start(timeout_s=300)
    load = SteadyLoad(settings, real, levels=(0, 1, 2, 3), interval_s=0.05)
    load.start()
    worker = assert_eventually(lambda: (ledger_senders(settings, 0) or [None])[-1],
                               timeout_s=60, message="a delivery from ready partition 0")
    executor = worker
    while Path(f"/proc/{executor}/exe").resolve().name != "java":   # its executor's JVM
        executor = int(Path(f"/proc/{executor}/stat").read_text().rsplit(")", 1)[1].split()[1])
    frozen = [executor, *descendants(executor)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    took = time.monotonic()
    replaced = assert_eventually(lambda: set(ledger_senders(settings, 0)) - set(frozen),
                                 timeout_s=120, message="ready partition 0's task started again")
    took = time.monotonic() - took
    assert_eventually(lambda: "asking Spark to kill and replace it" in job.log.read_text(),
                      timeout_s=60, message="the paused executor's kill asked for")
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass   # killed already
    time.sleep(10)
    load.stop()
    assert job.proc.poll() is None, f"the job died:\n{why_it_died(job.log.read_text())}"
    outcome = check_all_delivered(settings, real, load.sent, timeout_s=240)
    assert outcome.duplicates == 0, f"{outcome.duplicates} read twice (read_committed)"
    assert "committed nothing for" in job.log.read_text()
    order = ledger_senders(settings, 0)
    after = order[next(i for i, pid in enumerate(order) if pid in replaced):]
    assert not set(after) & set(frozen), "the paused task committed after its replacement"
    check_ledgered_once(settings, load)
    assert_eventually(lambda: not Path(f"/proc/{executor}/exe").exists(), timeout_s=30,
                      message="the paused executor's JVM gone")
    job.stop()
    with capsys.disabled():
        print(f"\non a standalone cluster: the executor of ready partition 0's dispatch task "
              f"(JVM {executor}, worker {worker}) paused, its task replaced by {sorted(replaced)} "
              f"{took:.1f} s later, the executor killed; {len(load.sent)} messages, lost 0, "
              f"early 0, read twice 0 (read_committed); lateness max "
              f"{max(outcome.lateness_ms)} ms")
