"""The bench's arithmetic: lost, early, duplicates and lateness from what was sent and read."""
import numpy as np
import pytest

from state.errors import ConfigError
from streaming.tools.bench import Result, scenarios_of
from streaming.tools.bench_load import tidy
from streaming.tools.bench_figures import after_warmup, join
from streaming.tools.bench_load import PROJECT


def test_join_counts_lost_early_and_duplicates():
    append = np.array([1000, 1000, 1000, 1000])
    due = np.array([2000, 2000, 5000, 5000])
    # 0 on time, 1 late by 300 then again (a duplicate), 2 early, 3 never read.
    seq = np.array([0, 1, 2, 1, 99])
    ts = np.array([2000, 2300, 4999, 2600, 9000])
    figures = join(append, due, seq, ts)
    assert figures["messages"] == 4
    assert figures["delivered"] == 3
    assert figures["lost"] == 1
    assert figures["duplicates"] == 1
    assert figures["early"] == 1
    assert figures["lateness_max_ms"] == 300          # the first copy of 1
    assert figures["lateness_p50_ms"] == 0


def test_an_early_duplicate_counts_as_early():
    due = np.array([2000])
    figures = join(np.array([1000]), due, np.array([0, 0]), np.array([2100, 1500]))
    assert figures["early"] == 1 and figures["duplicates"] == 1


def test_warm_up_lateness_is_reported_apart_and_losses_stay_counted():
    # Sent over 10 s; the first 4 s are the warm-up: 1 s late then, 100 ms late after.
    append = np.arange(0, 10_000, 1_000)
    due = append + 5_000
    late = np.where(append < 4_000, 1_000, 100)
    seq = np.arange(1, 10)                       # message 0, sent in the warm-up, never read
    figures = join(append, due, seq, due[seq] + late[seq])
    split = after_warmup(figures, 4)
    assert split["measured_messages"] == 6
    assert split["lateness_p50_ms"] == split["lateness_max_ms"] == 100
    assert split["warmup"]["messages"] == 3
    assert split["warmup"]["lateness_p50_ms"] == 1_000
    figures.update(split)
    assert figures["lost"] == 1                  # lost in the warm-up still fails the run


def test_lateness_is_reported_per_level_after_the_warm_up():
    # Levels 1 and 2 alternate; level 1 is 400 ms late, level 2 on time, timers 50 ms late.
    append = np.arange(0, 9_000, 1_000)
    level = np.array([1, 2, -1] * 3)
    due = append + np.array([1_000, 5_000, 0])[np.array([0, 1, 2] * 3)]
    late = np.array([400, 0, 50] * 3)
    seq = np.arange(9)
    figures = join(append, due, seq, due + late, level)
    assert figures["by_level"]["1"] == {"messages": 3, "lateness_p50_ms": 400,
                                        "lateness_p95_ms": 400, "lateness_p99_ms": 400,
                                        "lateness_max_ms": 400}
    assert figures["by_level"]["2"]["lateness_max_ms"] == 0
    assert figures["by_level"]["timer"]["lateness_p50_ms"] == 50
    split = after_warmup(figures, 3)               # the first three, one of each, are warm-up
    assert {lv: f["messages"] for lv, f in split["by_level"].items()} == {
        "1": 2, "2": 2, "timer": 2}
    # One level: nothing per level.
    assert "by_level" not in join(append, due, seq, due + late, np.ones(9, dtype=int))


def test_problems_name_early_and_lost_only():
    result = Result(plan={}, machine={}, scenarios={
        "steady": {"early": 0, "lost": 0, "lateness_p99_ms": 99_999},
        "burst": {"early": 2, "lost": 3}})
    assert result.problems() == ["burst: 2 early", "burst: 3 lost"]


def test_memory_peaks_tell_the_driver_jvm_from_the_driver_python_and_the_workers():
    """Children are told apart by their command line, as the real JVM and workers are; a
    child holding 200 MiB stands in for the JVM, one holding 50 MiB for the workers' daemon.
    Each forks once after touching its memory: the JVM's fork stands for a spawn that has not
    exec'd yet (same command line, the JVM's pages), the daemon's for a worker (its pages
    shared copy-on-write). Neither may count those pages twice. It runs in a process of its
    own: the test session's may have a real Spark JVM as a child."""
    import json
    import subprocess
    import sys

    script = """
import json, os, signal, subprocess, sys
import psutil
from streaming.tools.bench_load import MemoryPeaks
hold = ("import os, sys, time; b = bytearray({} * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print(1, flush=True); os.fork(); time.sleep(30)")
jvm = subprocess.Popen([sys.executable, "-c", hold.format(200), "org.apache.spark.deploy.SparkSubmit"],
                       stdout=subprocess.PIPE, start_new_session=True)
worker = subprocess.Popen([sys.executable, "-c", hold.format(50), "pyspark.daemon"],
                          stdout=subprocess.PIPE, start_new_session=True)
try:
    jvm.stdout.readline(), worker.stdout.readline()   # both have touched their memory
    for proc in (jvm, worker):                        # and forked
        while not psutil.Process(proc.pid).children():
            pass
    peaks = MemoryPeaks()
    peaks.sample()
    window = peaks.window_peaks()
    me = psutil.Process().memory_info().rss / 2**20
    print(json.dumps({"window": window, "stop": peaks.stop(), "me": me}))
finally:
    for proc in (jvm, worker):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=PROJECT, timeout=60, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    window = got["window"]
    assert 200 <= window["driver_jvm_rss_peak_mb"] < 300, "the JVM's fork is not counted"
    assert 50 <= window["python_workers_pss_peak_mb"] < 90, "shared pages count once"
    assert window["python_workers_pss_peak_mb"] / 2 <= window["python_worker_pss_peak_mb"] \
        < window["python_workers_pss_peak_mb"], "the largest worker alone: its share"
    assert abs(window["driver_python_rss_peak_mb"] - got["me"]) < 50
    assert window["driver_rss_peak_mb"] == pytest.approx(
        window["driver_jvm_rss_peak_mb"] + window["driver_python_rss_peak_mb"], abs=1)
    assert got["stop"] == window


def _run_folder(root):
    work = root / "bench-x"
    (work / "kafka" / "log").mkdir(parents=True)
    (work / "kafka" / "log" / "00000.log").write_bytes(b"x" * 1000)
    (work / "steady-sent.npz").write_bytes(b"y")
    return work


def test_a_clean_run_s_folder_is_removed_and_a_failed_or_kept_one_is_not(tmp_path):
    work = _run_folder(tmp_path)
    assert "removed" in tidy(work, keep=False, problems=[])
    assert not work.exists()

    work = _run_folder(tmp_path)
    assert "lost or early" in tidy(work, keep=False, problems=["steady: 1 lost"])
    assert (work / "steady-sent.npz").exists()
    assert "did not finish" in tidy(work, keep=False, problems=None)
    assert "kept" in tidy(work, keep=True, problems=[])
    assert (work / "kafka" / "log" / "00000.log").exists()


def test_the_burst_waits_for_a_batch_that_ended_after_its_last_delivery():
    """The batch that released a burst reports only once committed, possibly after the last
    delivery; the bench waits until a batch ended at or after it, so that one has reported."""
    from types import SimpleNamespace

    from streaming.tools.bench_figures import ended_since

    start = "2026-11-25T21:00:00.000Z"   # 1795640400000 ms
    query = SimpleNamespace(lastProgress={"timestamp": start,
                                          "durationMs": {"triggerExecution": 41_000}})
    assert ended_since(query, 1795640400000 + 41_000)
    assert not ended_since(query, 1795640400000 + 41_001)
    assert not ended_since(SimpleNamespace(lastProgress=None), 0)


def test_the_cluster_scenario_counts_deliveries_by_executor_folder(tmp_path):
    from streaming.tools.bench_cluster import per_executor

    home = tmp_path / "spark-cluster"
    senders = {f"h:11:{home}/worker-1/app-1/0": 5, f"h:12:{home}/worker-1/app-1/0": 2,
               f"h:13:{home}/worker-2/app-1/1": 3, "h:14:/work/main": 1}
    assert per_executor(senders, home) == {"worker-1 executor 0": 7, "worker-2 executor 1": 3,
                                           "driver": 1}


def test_scenarios_run_in_their_own_order_and_unknown_names_are_refused():
    # The drain needs a new job on its backlog: asked after steady, it still runs first.
    assert scenarios_of("steady,drain") == ("drain", "steady")
    assert scenarios_of(" restart , raw") == ("raw", "restart")
    assert scenarios_of("steady,raw-steady") == ("raw-steady", "steady")
    assert scenarios_of("cluster,steady") == ("steady", "cluster")
    with pytest.raises(ConfigError, match="unknown scenario stedy; choose from raw,raw-steady,drain"):
        scenarios_of("raw,stedy")
    with pytest.raises(ConfigError, match="none given"):
        scenarios_of(",")


def test_an_outage_s_backlog_is_timed_from_the_restart():
    from streaming.tools.bench_figures import outage_figures

    # Three messages due at 1,000 ms: one out before the restart (at 9,000), two after.
    held = join(np.array([0, 0, 0]), np.array([1000, 1000, 1000]), np.array([0, 1, 2]),
                np.array([9000, 14000, 21000]))
    figures = outage_figures(held, restarted_ms=10_000)
    assert figures["before_restart"] == 1
    assert figures["first_delivery_after_restart_s"] == -1.0   # the one the killed run sent
    assert figures["all_delivered_after_restart_s"] == 11.0
    assert figures["lateness_max_ms"] == 20_000 and figures["lost"] == 0


def test_the_restart_s_job_has_the_bench_s_settings():
    from streaming.tools.bench_load import child_env

    env = child_env({"PATH": "/bin", "DELAYQ_MAX_OFFSETS_PER_TRIGGER": "50000",
                     "DELAYQ_DATA_DIR": "/theirs"}, {"data_dir": "/bench/data", "ledger": "false"})
    assert env["DELAYQ_MAX_OFFSETS_PER_TRIGGER"] == "50000"    # the user's, as in the bench
    assert env["DELAYQ_DATA_DIR"] == "/bench/data"              # the bench's over it
    assert env["DELAYQ_LEDGER"] == "false" and env["PATH"] == "/bin"


def test_the_lateness_floor_is_the_raw_pipe_s_transit_less_each_level_s_delay():
    from streaming.tools.bench_figures import lateness_floor

    delays = (1_000, 5_000, 10_000)
    # A transit of 1,800 ms at p99: a 1 s message can be no less than 800 ms late, a 5 s one
    # (which a job can hold until due) has no floor from the pipe.
    assert lateness_floor({"lateness_p99_ms": 1_800}, (2, 1), delays) == {"1": 800, "2": 0}
    # Immediate messages (level 0) are due at their append: the whole transit is their floor.
    assert lateness_floor({"lateness_p99_ms": 1_800}, (0,), delays) == {"0": 1_800}
    assert lateness_floor(None, (1,), delays) == {}
    assert lateness_floor({"lateness_p99_ms": None}, (1,), delays) == {}


def test_a_process_s_role_is_its_first_match():
    from streaming.tools.bench_load import MemoryPeaks

    jars = "java -cp /v/site-packages/pyspark/jars/* "
    assert MemoryPeaks.role(jars + "org.apache.spark.deploy.SparkSubmit deploy/spark/main.py") == "spark_jvm"
    assert MemoryPeaks.role(jars + "org.apache.spark.executor.CoarseGrainedExecutorBackend") == "executor_jvms"
    assert MemoryPeaks.role(jars + "org.apache.spark.deploy.worker.Worker") == "cluster_daemons"
    assert MemoryPeaks.role("/v/bin/python /p/deploy/spark/main.py run") == "cluster_driver_python"
    assert MemoryPeaks.role("/v/bin/python -m pyspark.daemon") == "python_workers"
    # The `delayq run` child of the first-minute and restart scenarios: its driver.
    assert MemoryPeaks.role("/v/bin/python -m streaming.cli.main run") == "job_driver_python"


def test_the_driver_cost_is_the_driver_process_s_where_there_is_one():
    from streaming.tools.bench_figures import driver_cost

    cpu = {"bench_python": 0.1, "job_driver_python": 2.0}
    assert driver_cost({"delivered": 1_000_000, "cpu_s": cpu}) == {
        "driver_python_cpu_us_per_msg": 2.0}
    assert driver_cost({"delivered": 100_000, "cpu_s": {"bench_python": 0.5}}) == {
        "driver_python_cpu_us_per_msg": 5.0}


def test_the_bench_s_own_analysis_is_not_counted_as_the_driver_s():
    from streaming.tools.bench_load import MemoryPeaks

    peaks = MemoryPeaks()
    before = peaks.cpu_seconds()
    peaks.exclude(5.0)
    after = peaks.cpu_seconds()
    assert after["bench_analysis"] == 5.0
    assert after["bench_python"] < before["bench_python"] - 4.5


def test_the_burst_plot_shows_deliveries_after_the_due_second(tmp_path):
    """The burst's panel is deliveries over time after its one due second, with the lateness
    percentiles marked, not a scatter over due times (all equal)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from streaming.tools import bench_figures

    late = np.arange(0, 3_000, 3, dtype=np.int64)   # 1,000 deliveries over 3 s
    fig, ax = plt.subplots()
    bench_figures._plot_burst(ax, late)
    bars = sum(patch.get_height() for patch in ax.patches)
    marks = sorted(text.get_text() for text in ax.get_legend().get_texts())
    plt.close(fig)
    assert bars == 1_000
    assert marks == ["max 3.00 s", "p50 1.50 s", "p99 2.97 s"]
    result = Result(plan={}, machine={}, scenarios={"burst": {"_series": (
        np.full(len(late), 10**12), late)}})
    bench_figures.write(result, tmp_path / "b.json", tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 10_000
