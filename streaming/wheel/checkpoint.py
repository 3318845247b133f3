"""Guarding the checkpoint (pending messages, delayOffset): one missing, unreadable or written
under other settings is refused with its reason, never silently reset (replaying or dropping)."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from conf.settings import Settings
from state.columns import STATE_FORMAT
from state.seal import new_key
from state.errors import JobError
from sinks import store
from sinks.store import HadoopPath
from streaming.wheel.offsets import latest_batch

log = logging.getLogger(__name__)

STAMP = "delayq.json"
# Settings frozen into the checkpoint; with the direct dispatch's, what makes a message bad too:
# a held one read again after a restart must be judged as it was.
SHAPING = ("intake_topic", "level_delays_ms", "slot_ms", "timer_parts",
           "spark_shuffle_partitions", "late_tolerance_ms", "cold_bucket_ms", "near_horizon_ms",
           "dispatch_direct_max_delay_ms", "allowed_topics", "dlq_topic", "ring_slots",
           "ring_slot_ms")


class CheckpointError(JobError):
    """The message says why and what to do."""


def group_id(settings: Settings) -> str:
    return f"delayq.{settings.intake_topic}"


def fingerprint(settings: Settings) -> dict:
    values = {key: getattr(settings, key) for key in SHAPING}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def spark_line() -> str:
    """major.minor: a checkpoint resumes only on the line that wrote it."""
    from pyspark import __version__

    return ".".join(__version__.split(".")[:2])


def check_readable(path: Path | HadoopPath) -> None:
    """Refuse a checkpoint this process cannot read and write, or whose Spark files are torn."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is unreadable: it is not a folder")
    targets = [path, *(path / name for name in ("offsets", "commits", "state", "sources"))] \
        if isinstance(path, Path) else []   # a store answers for its own permissions
    for target in (t for t in targets if t.exists()):
        if not os.access(target, os.R_OK | os.W_OK | os.X_OK):
            raise CheckpointError(
                f"checkpoint {path} is unreadable: no read/write access to {target} for this "
                f"user (uid {os.getuid()}). Fix its permissions; delayq will not start over.")
    metadata = path / "metadata"
    if metadata.exists():
        try:
            json.loads(metadata.read_text().splitlines()[0])["id"]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise CheckpointError(f"checkpoint {path} is unreadable: {metadata} is not Spark "
                                  f"query metadata ({exc})") from None
    for folder in ("offsets", "commits"):
        batch = latest_batch(path / folder)
        if batch is None:
            continue
        latest = path / folder / str(batch)
        try:
            lines = latest.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"checkpoint {path} is unreadable: {latest}: {exc}") from None
        if not lines or not lines[0].startswith("v") or \
                not all(_is_json(line) for line in lines[1:] if line.strip()):
            raise CheckpointError(
                f"checkpoint {path} is unreadable: {latest} is torn or not a Spark {folder} "
                f"log. Restore the checkpoint from a backup; delayq will not start over.")


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def check_stamp(path: Path | HadoopPath, settings: Settings, allow_config_change: bool) -> None:
    """Refuse wheel state in another format, or shaping settings that moved since the stamp."""
    stamp = _stamp(path)
    if stamp is None and not (path / "state").is_dir():
        return
    was_format = (stamp or {}).get("state_format", 1)
    if was_format != STATE_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} holds wheel state in format {was_format}; this delayq reads "
            f"format {STATE_FORMAT}. Let that checkpoint drain with the delayq version that "
            f"wrote it (until delayq_pending_messages is 0), then start this version on a new "
            f"checkpoint (docs/operations.md, Upgrades).")
    was_spark = stamp["spark"]   # every stamp of this format has it, and every SHAPING key
    if was_spark != spark_line():
        raise CheckpointError(
            f"checkpoint {path} was written on Spark {was_spark}; this delayq runs Spark "
            f"{spark_line()}, whose state store and offset logs it was not read with. Let that "
            f"checkpoint drain with the delayq version that wrote it (until "
            f"delayq_pending_messages is 0), then start this version on a new intake topic "
            f"and checkpoint (docs/operations.md, Upgrades).")
    now, was = fingerprint(settings), stamp["settings"]
    moved = {key: (was[key], now[key]) for key in SHAPING if key in was and was[key] != now[key]}
    if moved and not allow_config_change:
        lines = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in moved.items())
        raise CheckpointError(
            f"checkpoint {path} was written with other settings ({lines}). Spark keeps "
            f"state laid out by the old values, so pending messages could be misplaced. "
            f"Put the settings back, or start a new checkpoint for the new settings and "
            f"let this one drain; --allow-config-change overrides this check.")


def check(settings: Settings, checkpoint: str, read_group: Callable[[], dict[int, int]],
          allow_fresh: bool = False, allow_config_change: bool = False) -> str:
    """"fresh" or "resume"; raises CheckpointError otherwise. Group offsets (`read_group`, read
    only for a missing or empty checkpoint) beside an empty checkpoint mean it was lost or
    moved."""
    path = store.path(checkpoint)
    fresh = not path.exists() or (path.is_dir() and latest_batch(path / "offsets") is None)
    if fresh and not allow_fresh and (group_offsets := read_group()):
        shown = ", ".join(f"{p}:{o}" for p, o in sorted(group_offsets.items()))
        raise CheckpointError(
            f"checkpoint {path} is missing or empty, but consumer group "
            f"{group_id(settings)} shows a run of this job read intake "
            f"{settings.intake_topic} up to offsets {shown}. Starting over would replay "
            f"the intake and lose the pending messages. Restore the checkpoint (or point "
            f"--checkpoint / DELAYQ_DATA_DIR at it); to start over anyway, run with "
            f"--allow-fresh-checkpoint.")
    if path.exists():
        check_readable(path)
    if fresh:
        return "fresh"
    check_stamp(path, settings, allow_config_change)
    return "resume"


def write_stamp(settings: Settings, checkpoint: str, started_ms: int = 0,
                seal: tuple[str, tuple[int, ...]] = ("", ())) -> None:
    """`seal`: `seal_of`'s key and offsets, kept in the stamp from then on."""
    store.write_atomic(store.path(checkpoint) / STAMP, json.dumps(
        {"settings": fingerprint(settings), "state_format": STATE_FORMAT, "spark": spark_line(),
         "started_ms": started_ms, "seal_key": seal[0], "legacy_before": list(seal[1])},
        indent=1) + "\n")


def seal_of(checkpoint: str, verdict: str,
            intake_ends: Callable[[], dict[int, int]]) -> tuple[str, tuple[int, ...]]:
    """The key that seals the service's own intake records (state/seal.py), and per intake
    partition the offset below which records follow the rules of the delayq before (state/
    envelope.py Rules.legacy_before): the stamp's; a new key for a new checkpoint; on one an
    older delayq wrote, a new key and the intake's end offsets now (what it wrote and split may
    still be unread by the wheel or by the dispatch tasks)."""
    stamp = _stamp(store.path(checkpoint)) if verdict == "resume" else None
    if stamp and stamp.get("seal_key") and "legacy_before" in stamp:
        return stamp["seal_key"], tuple(stamp["legacy_before"])
    if verdict == "fresh":
        return new_key(), ()
    ends = intake_ends()
    return ((stamp or {}).get("seal_key") or new_key(),
            tuple(ends.get(p, 0) for p in range(max(ends, default=-1) + 1)))


def _stamp(path: Path | HadoopPath, read=lambda stamp: stamp):
    """None without a stamp; an unreadable one refuses the checkpoint."""
    stamp_file = path / STAMP
    if not stamp_file.exists():
        return None
    try:
        return read(json.loads(stamp_file.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {stamp_file}: {exc}") from None


def direct_was_on(checkpoint: str, verdict: str) -> bool:
    """Whether the dispatch tasks read short levels from the intake in earlier runs: if so, a task
    starts an uncommitted partition at its beginning, else at the wheel's position."""
    stamp = _stamp(store.path(checkpoint)) if verdict == "resume" else None
    return stamp is not None and \
        stamp.get("settings", {}).get("dispatch_direct_max_delay_ms", -1) >= 0


def started_ms(checkpoint: str, verdict: str, now_ms: int) -> int:
    """When the query first started (0: unknown). Level messages due before it pass the wheel
    without state, which keeps due order only if that held from the first batch."""
    if verdict == "fresh":
        return now_ms
    return _stamp(store.path(checkpoint), lambda stamp: int(stamp.get("started_ms", 0))) or 0


# The consumer group mirrors the checkpoint's offsets. A fresh broker makes its coordinator on use.
GROUP_READ_WAIT_S = 15.0


def read_group_offsets(admin, settings: Settings, checkpoint: str) -> dict[int, int]:
    """Intake partition → the group's committed offset ({} when the group does not exist: no
    earlier run; a fresh broker makes its offsets topic, and so its coordinator, on this first
    use). Fails closed: an answer it cannot get refuses the start (`check` asks only when the
    checkpoint is missing or empty)."""
    from kafka.errors import GroupIdNotFoundError, KafkaError

    group = group_id(settings)
    deadline = time.monotonic() + GROUP_READ_WAIT_S
    while True:
        try:
            answer = admin.list_group_offsets({group: None}).get(group, {})
            return {tp.partition: meta.offset for tp, meta in answer.items()
                    if tp.topic == settings.intake_topic and meta.offset >= 0}
        except GroupIdNotFoundError:
            return {}
        except KafkaError as exc:
            if exc.retriable and time.monotonic() < deadline:
                time.sleep(0.5)   # a coordinator loading or moving
                continue
            raise CheckpointError(_unreadable_group(settings, checkpoint, group, exc)) from None


def _unreadable_group(settings: Settings, checkpoint: str, group: str, exc) -> str:
    why = (f"this client may not read it: grant its principal Describe on group {group} "
           f"(kafka-acls.sh --add --allow-principal User:<delayq's user> --operation Describe "
           f"--group {group})" if "Authorization" in type(exc).__name__
           else f"the broker did not answer within {GROUP_READ_WAIT_S:.0f} s; start again "
                f"once it does")
    return (f"checkpoint {store.path(checkpoint)} is missing or empty, and consumer group "
            f"{group}, which shows whether an earlier run of this job read intake "
            f"{settings.intake_topic}, could not be read ({type(exc).__name__}: {exc}): {why}. "
            f"Starting over after an earlier run would replay the intake and lose its pending "
            f"messages; to start over anyway, run with --allow-fresh-checkpoint.")


def mirror_offsets(admin, settings: Settings, offsets: dict[int, int]) -> None:
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    admin.alter_group_offsets(group_id(settings), {
        TopicPartition(settings.intake_topic, p): OffsetAndMetadata(o, "", -1)
        for p, o in offsets.items()})
