"""The project's error base: the CLI prints these as one line and exits 2.

raise SparrowError("model directory /x does not exist")
if is_disk_full(err, folder):          # a write that failed: was the disk full?
    raise disk_full_error(folder, needed_bytes) from None
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

# what a full disk looks like from Python (OSError), safetensors ("os error 28"), pyarrow
# ("[errno 28]"), DuckDB ("No space left on device") and a quota
FULL_MARKS = ("no space left on device", "os error 28", "errno 28", "disk quota exceeded")
# torch.save's zip writer reports a short write without its cause ("[enforce fail at
# inline_container.cc:672] . unexpected pos 576 vs 534"): a full disk when little is free
SHORT_WRITE_MARKS = ("unexpected pos", "pytorchstreamwriter failed")
LOW_SPACE_BYTES = 64 << 20


class SparrowError(Exception):
    """A user-facing error whose message names the thing that is wrong."""


class SparrowWarning(UserWarning):
    """Something skipped or degraded that the run survives; the CLI prints it as one line."""


class DiskFullError(SparrowError):
    """A write that ran out of disk space; the message names the path and the space needed."""


def free_bytes(path: str | Path) -> int:
    """Free bytes on the filesystem of `path` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def is_disk_full(err: BaseException, path: str | Path) -> bool:
    """True when `err` (or what caused it) is a write that found the disk of `path` full."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen).lower()
        if any(mark in text for mark in FULL_MARKS):
            return True
        if any(mark in text for mark in SHORT_WRITE_MARKS) and free_bytes(path) < LOW_SPACE_BYTES:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def disk_full_error(path: str | Path, needed_bytes: int | None, note: str = "") -> DiskFullError:
    """One line: the path, the free space, the space needed, what to do."""
    needed = f"about {mib(needed_bytes)} needed" if needed_bytes else "more needed"
    return DiskFullError(
        f"no space left on device writing {path}: {mib(free_bytes(path))} free on its "
        f"filesystem, {needed}{note}; nothing of this write was kept or recorded: free some "
        "space and run the same command again to resume here"
    )
