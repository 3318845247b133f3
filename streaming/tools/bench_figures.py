"""The bench's figures: lateness from sent and delivered stamps, per level and after a warm-up,
from the queries' progress, CPU and memory, and the JSON and PNG it writes."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np


def du(path: Path) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def percentile(values: np.ndarray, q: float) -> int | None:
    return int(np.percentile(values, q, method="higher")) if len(values) else None


def join(append: np.ndarray, due: np.ndarray, seq: np.ndarray, ts: np.ndarray,
         level: np.ndarray | None = None, seen: np.ndarray | None = None) -> dict:
    """Figures of one scenario from what was sent (per sequence number: append and due time,
    and the level, -1 for a timer) and what was read (sequence number and broker timestamp of
    each delivery, and when the read_committed reader saw it: `visible_*`, which counts the
    wait for a dispatch transaction's commit that the broker's timestamp does not)."""
    n = len(due)
    ok = (seq >= 0) & (seq < n)
    seq, ts = seq[ok], ts[ok]
    order = np.argsort(ts, kind="stable")
    seq, ts = seq[order], ts[order]
    first = np.unique(seq, return_index=True)[1]   # the first delivery of each message
    fseq, fts = seq[first], ts[first]
    late = fts - due[fseq]
    visible = {}
    if seen is not None and len(seen) == len(ok):
        shown = seen[ok][order][first] - due[fseq]
        visible = {f"visible_{k.split('_', 1)[1]}": v for k, v in lateness(shown).items()}
    delivered = len(fseq)
    span_s = (fts.max() - fts.min()) / 1000 if delivered > 1 else 0.0
    return {
        "messages": int(n), "delivered": int(delivered), "lost": int(n - delivered),
        "duplicates": int(len(seq) - delivered),
        # Early is judged on every copy, duplicates included.
        "early": int(np.sum(ts < due[seq])),
        **lateness(late), **visible,
        "out_msg_s": round((delivered - 1) / span_s, 1) if span_s else None,
        **by_level(late, None if level is None else level[fseq]),
        "_series": (due[fseq], late),
        "_sent_ms": append[fseq], "_load_start_ms": int(append.min()) if n else 0,
        "_levels": None if level is None else level[fseq],
    }


def lateness(late: np.ndarray) -> dict:
    return {"lateness_p50_ms": percentile(late, 50), "lateness_p95_ms": percentile(late, 95),
            "lateness_p99_ms": percentile(late, 99),
            "lateness_max_ms": int(late.max()) if len(late) else None}


def by_level(late: np.ndarray, levels: np.ndarray | None) -> dict:
    """Lateness per level ("timer" for -1), where the load had more than one: a short level
    is bounded by how soon the job reads it, a long one by how close to its due time the
    wheel fires it, and one figure over both hides which one is late."""
    if levels is None or len(np.unique(levels)) < 2:
        return {}
    return {"by_level": {("timer" if lv < 0 else str(int(lv))): {
        "messages": int(np.sum(levels == lv)), **lateness(late[levels == lv])}
        for lv in np.unique(levels)}}


def after_warmup(figures: dict, warmup_s: float) -> dict:
    """The lateness of the messages sent after the first `warmup_s` seconds of a load, and
    that of the warm-up apart: a job runs for days, and its first minute (a young JVM still
    compiling) is not its sustained state. Lost, early and duplicates stay over every message."""
    late, levels = figures["_series"][1], figures.get("_levels")
    warm = figures["_sent_ms"] < figures["_load_start_ms"] + warmup_s * 1000
    return {**lateness(late[~warm]), "measured_messages": int(np.sum(~warm)),
            **by_level(late[~warm], None if levels is None else levels[~warm]),
            "warmup": {"seconds": warmup_s, "messages": int(np.sum(warm)), **lateness(late[warm])}}


def driver_cost(figures: dict) -> dict:
    """The driver's Python CPU per delivered message (µs): the bench's own process, which runs
    the job's driver in-process, less its memory sampling and its analysis; in the
    cluster scenario the submitted driver's Python process, in `first-minute` and `restart` the
    `delayq run` child's."""
    delivered = figures.get("delivered")
    cpu = figures.get("cpu_s", {})
    python_s = cpu.get("cluster_driver_python", cpu.get("job_driver_python",
                                                         cpu.get("bench_python")))
    if not delivered or python_s is None:
        return {}
    return {"driver_python_cpu_us_per_msg": round(python_s * 1e6 / delivered, 1)}


def cpu_used(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """CPU seconds per role between two readings, and the share of the machine they took."""
    used = {role: round(after.get(role, 0.0) - before.get(role, 0.0), 1) for role in after}
    cores = os.cpu_count() or 1
    total = sum(used.values())
    return {"cpu_s": used, "cpu_total_s": round(total, 1),
            "machine_busy": round(total / (wall_s * cores), 2) if wall_s > 0 else None}


def batch_figures(query, after: int) -> dict:
    progress = [p for p in query.recentProgress if p["batchId"] > after]
    took = np.array([p["durationMs"].get("triggerExecution", 0) for p in progress])
    rows = sum(p["numInputRows"] for p in progress)
    return {"batches": len(progress), "batch_p50_ms": percentile(took, 50),
            "batch_p90_ms": percentile(took, 90), "batch_max_ms": percentile(took, 100),
            "rows_per_batch_p50": percentile(np.array([p["numInputRows"] for p in progress]), 50),
            "input_rows": rows}


def _start_ms(progress: dict) -> float:
    """When a batch began, from its progress report (epoch ms)."""
    from datetime import datetime

    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp() * 1000


def timeline(query, after: int, summaries: list) -> list[dict]:
    """Each batch after `after`: its start, duration, input rows, Spark's own phases and the
    job's steps (foreachBatch), for finding what makes the long batches long."""
    steps = {s.batch_id: s.timings for s in summaries}
    fired = {s.batch_id: s.by_kind.get("deliver", 0) for s in summaries}
    return [{"batch": p["batchId"], "start_ms": int(_start_ms(p)),
             "ms": p["durationMs"].get("triggerExecution", 0), "rows": p["numInputRows"],
             "fired": fired.get(p["batchId"], 0),
             "phases_ms": {k: v for k, v in p["durationMs"].items() if k != "triggerExecution"},
             "steps_s": steps.get(p["batchId"], {}), "state": _state_figures(p)}
            for p in query.recentProgress if p["batchId"] > after]


STATE_FIGURES = ("numRowsUpdated", "allUpdatesTimeMs", "numRowsRemoved", "allRemovalsTimeMs",
                 "commitTimeMs")


def _state_figures(progress: dict) -> dict:
    """The wheel's state store in one batch, from its progress report: rows updated and
    removed and the time their puts and removes took, the commit's time, and RocksDB's own
    figures (Spark's `rocksdb*` custom metrics: bytes read and written, get and put latency…)."""
    operators = progress.get("stateOperators") or []
    if not operators:
        return {}
    wheel = operators[0]
    figures = {k: wheel.get(k) for k in STATE_FIGURES}
    figures.update({k: v for k, v in (wheel.get("customMetrics") or {}).items()
                    if k.startswith("rocksdb")})
    return figures


def processing_rate(query, after: int, until_ms: int | None) -> dict:
    """Rows per second of batch time over the batches that started before the last delivery:
    the pipe's own throughput, without the query's start-up or the reader's polling."""
    if until_ms is None:
        return {}
    # The batch that made the last delivery reports its progress when it commits.
    deadline = time.time() + 60
    while time.time() < deadline and not any(
            _start_ms(p) + p["durationMs"].get("triggerExecution", 0) >= until_ms
            for p in query.recentProgress):
        time.sleep(0.5)
    took = rows = 0
    for p in query.recentProgress:
        if p["batchId"] > after and _start_ms(p) <= until_ms:
            took += p["durationMs"].get("triggerExecution", 0)
            rows += p["numInputRows"]
    return {"batch_rows": rows, "batch_seconds": round(took / 1000, 2),
            "processing_msg_s": round(rows / (took / 1000), 1) if took else None}


def last_delivery_ms(figures: dict) -> int | None:
    due, late = figures["_series"]
    return int((due + late).max()) if len(due) else None


def step_figures(summaries) -> dict:
    """Median seconds of each step of the delivery batches (wheel, kafka, ledger, …)."""
    names = {name for summary in summaries for name in summary.timings}
    return {name: round(float(np.median([s.timings[name] for s in summaries
                                         if name in s.timings])), 3) for name in sorted(names)}


def ended_since(query, ms: int) -> bool:
    """Whether a batch of `query` reported as ended at or after `ms` (epoch ms)."""
    progress = query.lastProgress
    return bool(progress) and _start_ms(progress) + progress["durationMs"].get(
        "triggerExecution", 0) >= ms


def last_batch(query) -> int:
    return query.lastProgress["batchId"] if query.lastProgress else -1


def stamps_of(figures: dict) -> np.ndarray:
    """Each delivered message's first delivery time (broker timestamp, ms)."""
    due, late = figures["_series"]
    return due + late


def outage_figures(held: dict, restarted_ms: float) -> dict:
    """An outage's backlog after the restart: when its first and last messages left, how
    fast it was caught up (first to last delivery), and how late it was."""
    stamps = stamps_of(held)
    figures = {k: held[k] for k in ("messages", "delivered", "lost", "early", "duplicates",
                                    "lateness_p50_ms", "lateness_p99_ms", "lateness_max_ms",
                                    "out_msg_s")}
    if len(stamps):
        figures.update(
            first_delivery_after_restart_s=round((stamps.min() - restarted_ms) / 1000, 1),
            all_delivered_after_restart_s=round((stamps.max() - restarted_ms) / 1000, 1),
            before_restart=int(np.sum(stamps < restarted_ms)))
    return figures


def lateness_floor(pipe: dict | None, levels: tuple[int, ...],
                   delays_ms: tuple[int, ...]) -> dict[str, int]:
    """Per level, the p99 lateness a job would have if it read and wrote each message as soon
    as the raw pipe does under the same load (`raw-steady`): the pipe's p99 transit minus
    the level's delay (a constant, so the percentile moves with it), never below 0. A job
    that does more per batch than the pipe cannot be lower."""
    p99 = (pipe or {}).get("lateness_p99_ms")
    if p99 is None:
        return {}
    # Level 0 is delivered at once: no delay to take off.
    return {str(lv): max(0, p99 - (delays_ms[lv - 1] if lv > 0 else 0))
            for lv in sorted(set(levels))}


def cpu_probe_ms(loops: int = 3_000_000, tries: int = 3) -> float:
    """How fast this host runs one core's work now: the best of `tries` timings of a fixed
    Python loop, in ms. This host's speed varies from day to day and within a run (every
    process's CPU seconds for the same work, the load generator's too, were 1.5 to 2 times
    their usual on some days), so a run's figures compare with another's only at a similar
    probe; the ratios measured within a run do not depend on it."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        total = 0
        for i in range(loops):
            total += i
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def public(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if not k.startswith("_")}


def write(result, json_path: Path, plot_path: Path | None) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    body = {"plan": result.plan, "machine": result.machine,
            "scenarios": {k: public(v) for k, v in result.scenarios.items()},
            # Per batch, for the scenarios at a constant rate (not printed: long).
            "timelines": {k: v["timeline"] for k, v in result.scenarios.items()
                          if "timeline" in v}}
    json_path.write_text(json.dumps(body, indent=2) + "\n")
    if plot_path is None:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in ("raw-steady", "steady", "timers", "burst", "backlog", "restart")
             if n in result.scenarios]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 3.2 * len(shown)), squeeze=False)
    for ax, name in zip(axes[:, 0], shown):
        due, late = result.scenarios[name]["_series"]
        if not len(due):
            continue
        if name == "burst":   # one due second: what a person asks is when they all left
            _plot_burst(ax, late)
            continue
        sent = result.scenarios[name]["_sent_ms"]
        if len(due) > 40_000:
            pick = np.random.default_rng(0).choice(len(due), 40_000, replace=False)
            due, late, sent = due[pick], late[pick], sent[pick]
        if name == "timers":   # the direct window's timers apart from those beyond it
            _plot_timers(ax, due, late, due - sent, result.scenarios[name]["window_ms"])
        else:
            ax.scatter((due - due.min()) / 1000, late, s=1, alpha=0.4)
        # The raw pipe keeps nothing: its "lateness" is the transit from append to copy.
        ax.set_title(f"{name}: {'transit' if name == 'raw-steady' else 'lateness'} by due time")
        ax.set_xlabel("due time (s from the first)")
        ax.set_ylabel("lateness (ms)")
        ax.axhline(0, color="red", linewidth=0.8)
    fig.tight_layout()
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot_path, dpi=90)
    plt.close(fig)


def _plot_timers(ax, due: np.ndarray, late: np.ndarray, after: np.ndarray,
                 window_ms: int) -> None:
    x = (due - due.min()) / 1000
    for inside, label in ((after > window_ms, "beyond the direct window"),
                          (after <= window_ms, "within the direct window")):
        ax.scatter(x[inside], late[inside], s=1, alpha=0.4, label=label)
    ax.legend(loc="upper right", fontsize=8, markerscale=6)


def _plot_burst(ax, late: np.ndarray) -> None:
    """Deliveries per 100 ms after the burst's due second, their running share, and the
    lateness percentiles marked on the time axis."""
    seconds = late / 1000
    bins = np.arange(min(0.0, seconds.min()), seconds.max() + 0.2, 0.1)
    ax.hist(seconds, bins=bins, color="tab:blue", alpha=0.7)
    ax.set_title(f"burst: {len(late):,} messages due in one second, deliveries after it")
    ax.set_xlabel("time after the due second (s)")
    ax.set_ylabel("deliveries per 100 ms")
    share = ax.twinx()
    share.plot(np.sort(seconds), np.arange(1, len(seconds) + 1) / len(seconds) * 100,
               color="black", linewidth=1)
    share.set_ylabel("delivered (%)")
    share.set_ylim(0, 101)
    for q, color in ((50, "green"), (99, "orange"), (100, "red")):
        at = np.percentile(seconds, q, method="higher")
        ax.axvline(at, color=color, linewidth=0.9, linestyle="--",
                   label=f"{'max' if q == 100 else f'p{q}'} {at:.2f} s")
    ax.axvline(0, color="red", linewidth=0.8)
    ax.legend(loc="center right", fontsize=8)
