"""`delayq status`: the dashboard's headline figures, read from the job's exporter."""
from __future__ import annotations

import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


def fetch(url: str) -> dict[str, list[tuple[dict, float]]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def _total(samples, name) -> float:
    return sum(v for _, v in samples.get(name, []))


def _by(samples, name, label) -> dict[str, float]:
    return {labels.get(label, ""): v for labels, v in samples.get(name, [])}


def quantile(samples, name: str, q: float) -> float | None:
    """Estimate a quantile from cumulative histogram buckets (upper bound of its bucket)."""
    buckets = sorted(((float(l["le"]), v) for l, v in samples.get(f"{name}_bucket", [])),
                     key=lambda b: b[0])
    if not buckets or buckets[-1][1] == 0:
        return None
    target = q * buckets[-1][1]
    for bound, count in buckets:
        if count >= target:
            return bound
    return buckets[-1][0]


def render(samples) -> str:
    lines = [f"received {_total(samples, 'delayq_messages_received_total'):.0f}   "
             f"delivered {_total(samples, 'delayq_messages_delivered_total'):.0f}   "
             f"dead-lettered {_total(samples, 'delayq_messages_dead_lettered_total'):.0f}   "
             f"cancelled {_total(samples, 'delayq_messages_cancelled_total'):.0f}"]
    p50 = quantile(samples, "delayq_delivery_lateness_seconds", 0.5)
    p99 = quantile(samples, "delayq_delivery_lateness_seconds", 0.99)
    fmt = lambda v: "-" if v is None else (f"≤{v:g} s" if v != float("inf") else ">60 s")
    lines.append(f"lateness p50 {fmt(p50)}   p99 {fmt(p99)}   "
                 f"watermark lag {_total(samples, 'delayq_watermark_lag_seconds'):.2f} s   "
                 f"intake behind {_total(samples, 'delayq_intake_offsets_behind'):.0f}")
    count = _total(samples, "delayq_batch_duration_seconds_count")
    mean = _total(samples, "delayq_batch_duration_seconds_sum") / count if count else 0
    lines.append(f"batches {count:.0f}, mean duration {mean:.2f} s")
    pending = _by(samples, "delayq_pending_messages", "level")
    offsets = _by(samples, "delayq_delay_offset", "level")
    lines.append(f"{'level':>6} {'pending':>9} {'delayOffset':>12}")
    for level in sorted(set(pending) | set(offsets), key=int):
        lines.append(f"{level:>6} {pending.get(level, 0):>9.0f} {offsets.get(level, 0):>12.0f}")
    for reason, n in sorted(_by(samples, "delayq_messages_dead_lettered_total", "reason").items()):
        lines.append(f"dead letters {reason}: {n:.0f}")
    return "\n".join(lines)
