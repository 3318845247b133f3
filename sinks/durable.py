"""Files that are on disk before a batch commits: written under a temporary name, synced,
renamed, and the folder synced (the ledger's spool, the driver's hold's spool)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


def write_durably(final: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write` the file's bytes to `.<name>.tmp` beside `final`, then make it `final`: a crash
    leaves either the whole file or a temporary one (which the spools' starts delete)."""
    tmp = final.with_name(f".{final.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(final.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
