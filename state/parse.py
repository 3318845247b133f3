"""The parse stage over one Arrow batch of intake records: envelopes and wheel groups.

Pandas in, pandas out; the per-record rules are in `state.envelope`.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import pandas as pd

from state.columns import ENVELOPE
from state.envelope import Kind, Rules, parse
from state.wheel import group_of


def _headers(cell) -> list[tuple[str, bytes | None]]:
    if cell is None:
        return []
    return [(h["key"], h["value"]) for h in cell]


def _as_dicts(headers) -> list[dict]:
    return [{"key": k, "value": v} for k, v in headers]


def parse_frame(frame: pd.DataFrame, rules: Rules, slot_ms: int, spread: int,
                now_ms: int) -> pd.DataFrame:
    """Intake columns (key, value, ipart, ioff, append_ms, headers) → ENVELOPE columns."""
    out: dict[str, list] = {name: [] for name in ENVELOPE.names}
    for key, value, ipart, ioff, append_ms, cell in zip(
            frame["key"], frame["value"], frame["ipart"], frame["ioff"],
            frame["append_ms"], frame["headers"]):
        ipart, ioff, append_ms = int(ipart), int(ioff), int(append_ms)
        raw = _headers(cell)
        env = parse(raw, ipart, ioff, append_ms, rules, now_ms)
        bucket, slot = group_of(env.kind, env.level, env.due_ms, ipart, ioff, slot_ms, spread)
        out["kind"].append(env.kind.value)
        out["bucket"].append(bucket)
        out["slot"].append(slot)
        out["level"].append(env.level)
        out["due_ms"].append(env.due_ms)
        out["uniq_key"].append(env.uniq_key)
        out["topic"].append(env.real_topic)
        out["qid"].append(env.real_qid)
        out["key"].append(key)
        out["value"].append(value)
        out["headers"].append(_as_dicts(raw if env.kind == Kind.DEAD else env.user_headers))
        out["reason"].append(env.reason)
        out["cancel_key"].append(env.cancel_key)
        out["rolled"].append(env.rolled)
        out["append_ms"].append(append_ms)
        out["ipart"].append(ipart)
        out["ioff"].append(ioff)
    result = pd.DataFrame(out, columns=ENVELOPE.names)
    result["qid"] = result["qid"].astype("Int32")
    return result


def make_parser(rules: Rules, slot_ms: int, spread: int,
                clock: Callable[[], float] = time.time):
    """The function handed to mapInPandas."""

    def parse_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            yield parse_frame(frame, rules, slot_ms, spread, int(clock() * 1000))

    return parse_batches
