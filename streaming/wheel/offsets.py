"""RocketMQ's `delayOffset.json` ({"offsetTable": {"1": 2}}) read from a checkpoint's last commit:
level L is intake partition L-1, mapped to the next offset the job will read."""
from __future__ import annotations

import json
from pathlib import Path

from state.errors import JobError


def latest_batch(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=None)


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """Intake partition → next offset, as of the last committed batch ({} before the first)."""
    if not (checkpoint / "offsets").is_dir():
        raise JobError(f"{checkpoint} is not a delayq checkpoint (no offsets/ folder)")
    batch = latest_batch(checkpoint / "commits")
    if batch is None:
        return {}
    for line in (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2:]:
        if line.strip().startswith("{"):
            sources = json.loads(line)
            if topic in sources:
                return {int(p): int(o) for p, o in sources[topic].items()}
    raise JobError(f"batch {batch} of {checkpoint} did not read topic {topic}")


def delay_offset_table(checkpoint: Path, topic: str,
                       heartbeats: int | None = None) -> dict[str, dict[str, int]]:
    """Without the heartbeats' partition (`Settings.heartbeat_partition`)."""
    offsets = committed_offsets(checkpoint, topic)
    return {"offsetTable": {str(p + 1): o for p, o in sorted(offsets.items()) if p != heartbeats}}
