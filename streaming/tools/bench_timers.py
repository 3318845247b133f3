"""The `timers` scenario: timers of every header form (TIMER_DELIVER_MS ahead and in the past,
TIMER_DELAY_MS, TIMER_DELAY_SEC) at the steady rate over the plan's warm-up and `seconds`, due
within `timers_spread_s` of their append (streaming/tools/loadgen.py TimerMix). Reports the
lateness per band of due time after append: past (due at append), under 3 s, the rest of the
direct window (`dispatch_direct_max_delay_ms`) and beyond it, each against `steady`'s p99 when
that ran in the same bench."""
from __future__ import annotations

import numpy as np

from streaming.tools.bench_figures import lateness


def run(bench) -> dict:
    plan = bench.plan
    figures = bench._constant("timers", plan.rate, plan.seconds, plan.warmup_s,
                              timer_mix_ms=int(plan.timers_spread_s * 1000))
    window = bench.settings.dispatch_direct_max_delay_ms
    figures["bands"] = bands(figures, plan.warmup_s, window)
    figures["window_ms"] = window
    return figures


def bands(figures: dict, warmup_s: float, window_ms: int) -> dict:
    """Lateness of the messages sent after the warm-up, per band of due time after append."""
    due, late = figures["_series"]
    after = due - figures["_sent_ms"]
    measured = figures["_sent_ms"] >= figures["_load_start_ms"] + warmup_s * 1000
    out = {}
    for name, low, high in (("past_or_now", -2**62, 0), ("under_3s", 0, 3_000),
                            ("window", 3_000, window_ms), ("beyond_window", window_ms, 2**62)):
        inside = measured & (after > low) & (after <= high)
        if np.any(inside):
            out[name] = {"messages": int(np.sum(inside)), **lateness(late[inside])}
    return out
