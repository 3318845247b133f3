"""The short benchmark (`delayq bench --short`) in CI: every scenario on the session broker
and Spark; it fails only on early or lost messages, never on speed."""
from __future__ import annotations

import json

import pytest

from streaming.bench import Bench, Plan, write

pytestmark = pytest.mark.integration


def test_short_bench_delivers_everything_and_nothing_early(job_settings, spark, work_dir, capsys):
    settings = job_settings()
    work = work_dir / f"bench-{settings.intake_topic}"
    work.mkdir()
    result = Bench(settings, spark, Plan.short(), work, log=lambda line: None).run()

    assert set(result.scenarios) == set(Plan.short().scenarios)
    for name, figures in result.scenarios.items():
        assert figures["messages"] > 0, name
        assert figures["delivered"] == figures["messages"], (name, figures["lost"])
    assert result.problems() == []
    write(result, work / "result.json", work / "lateness.png")
    assert (work / "lateness.png").stat().st_size > 0
    written = json.loads((work / "result.json").read_text())
    with capsys.disabled():
        print("\nshort bench (figures only, not judged):")
        for name, figures in written["scenarios"].items():
            print(f"  {name:7} {figures['messages']} msgs, lost {figures['lost']}, early "
                  f"{figures['early']}, dups {figures['duplicates']}, lateness p50/p99/max "
                  f"{figures['lateness_p50_ms']}/{figures['lateness_p99_ms']}/"
                  f"{figures['lateness_max_ms']} ms, out {figures['out_msg_s']} msg/s")
        print(f"  drain/raw throughput ratio: {written['machine'].get('drain_ratio_to_raw')}")
