"""`delayq bench --short` in CI, as a user runs it: its own broker, its own Spark session,
every short scenario, a restart after a downtime among them; it fails only on early or lost
messages, never on speed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streaming.tools.bench import Plan
from tests.conftest import PROJECT

pytestmark = pytest.mark.integration


def test_short_bench_delivers_everything_and_nothing_early(work_dir, capsys):
    folder = work_dir / "bench-cli"
    out = folder / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    run = subprocess.run(
        [sys.executable, "-m", "streaming.cli.main", "bench", "--short", "--data-dir", str(folder),
         "--driver-memory", "2g", "--out", str(out)],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])

    written = json.loads(out.read_text())
    assert set(written["scenarios"]) == set(Plan.short().scenarios)
    for name, figures in written["scenarios"].items():
        assert figures["messages"] > 0, name
        assert figures["delivered"] == figures["messages"], (name, figures["lost"])
        assert figures["lost"] == 0 and figures["early"] == 0, (name, figures)
    # The raw pipe under the steady load sets, per level, the floor under delayq's lateness.
    assert set(written["machine"]["steady_lateness_floor_p99_ms"]) == {"1", "2"}
    steady = written["scenarios"]["steady"]      # its lateness after the warm-up, and during
    assert steady["warmup"]["messages"] > 0 and steady["measured_messages"] > 0
    assert steady["warmup"]["messages"] + steady["measured_messages"] == steady["delivered"]
    # The restart's downtime and the backlog sent during it: the backlog's figures are its own,
    # none of it left before the restart (the kill took the whole job).
    restart = written["scenarios"]["restart"]
    outage = restart["outage"]
    assert restart["down_s"] >= 5
    assert outage["messages"] == outage["delivered"] == 2000
    assert outage["lost"] == 0 and outage["early"] == 0
    assert outage["before_restart"] == 0 and outage["first_delivery_after_restart_s"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
    # A clean run leaves its result, not its gigabytes: broker log, checkpoint, arrays.
    assert sorted(p.name for p in folder.iterdir()) == ["result.json", "result.png"]
    assert "removed the run's data" in run.stdout
    with capsys.disabled():
        print("\nshort bench (figures only, not judged):")
        for name, figures in written["scenarios"].items():
            print(f"  {name:10} {figures['messages']} msgs, lost {figures['lost']}, early "
                  f"{figures['early']}, dups {figures['duplicates']}, lateness p50/p99/max "
                  f"{figures['lateness_p50_ms']}/{figures['lateness_p99_ms']}/"
                  f"{figures['lateness_max_ms']} ms, out {figures['out_msg_s']} msg/s")
        warmup = steady["warmup"]
        print(f"  steady's warm-up ({warmup['seconds']:.0f} s, {warmup['messages']} msgs) apart: "
              f"lateness p50/p99/max {warmup['lateness_p50_ms']}/{warmup['lateness_p99_ms']}/"
              f"{warmup['lateness_max_ms']} ms")
        print(f"  drain/raw throughput ratio: {written['machine'].get('drain_ratio_to_raw')}")
        print(f"  this host's CPU probe (ms, lower is faster): {written['machine']['cpu_probe_ms']}")
