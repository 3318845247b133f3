"""The `scattered` scenario: timers whose due times spread uniformly over the next
`scattered_spread_s` (TIMER_DELAY_MS drawn per message), at the steady rate, for
`scattered_fill_s` of fill and then `seconds` measured. The wheel then holds about rate x spread
messages, each due on its own: the index's worst case, where no two messages due together sit
side by side in the intake. Reports the lateness of the messages sent after the fill and, at the
end of the load, what the wheel holds and what its state and checkpoint take on disk."""
from __future__ import annotations

import threading
import time

from streaming.tools.bench_figures import du


def run(bench) -> dict:
    plan = bench.plan
    held: dict = {}
    done = threading.Event()

    def measure_at_the_load_end() -> None:
        if not done.wait(plan.scattered_fill_s + plan.seconds):
            held.update(state_figures(bench))

    threading.Thread(target=measure_at_the_load_end, name="bench-scattered-state",
                     daemon=True).start()
    try:
        figures = bench._constant("scattered", plan.rate, plan.seconds, plan.scattered_fill_s,
                                  delay_spread_ms=int(plan.scattered_spread_s * 1000))
    finally:
        done.set()
    figures.update(spread_s=plan.scattered_spread_s, fill_s=plan.scattered_fill_s, **held)
    return figures


def state_figures(bench) -> dict:
    """The bytes of the dispatch tasks' rings on the broker; what the wheel holds now (its
    batches' pending deltas since the job started), the bytes of its state store's live files
    (RocksDB's SST files, as its last progress reports them) and of the checkpoint's state
    folder (every retained version), each per held message."""
    pending = sum(sum(s.pending_delta_by_level.values()) for s in bench.summaries)
    progress = bench.job.query.lastProgress or {}
    sst = sum(op.get("customMetrics", {}).get("rocksdbSstFileSize", 0)
              for op in progress.get("stateOperators", []))
    folder = du(bench.work / "ckpt" / "state")
    per = (lambda n: round(n / pending, 1) if pending > 0 else None)
    # The rings' log segments on the bench's own broker (None: a Kafka of the settings'); not
    # their indexes, which Kafka preallocates (10 MB each, sparse).
    ring = list((bench.work / "kafka" / "data").glob(f"{bench.settings.ring_topic}-*/*.log"))
    return {"ring_bytes": sum(f.stat().st_size for f in ring) if ring else None,
            "pending_at_load_end": pending, "state_sst_bytes": sst,
            "state_sst_bytes_per_pending": per(sst), "checkpoint_state_bytes": folder,
            "checkpoint_state_bytes_per_pending": per(folder),
            "checkpoint_bytes": du(bench.work / "ckpt"), "measured_at": round(time.time(), 1)}
