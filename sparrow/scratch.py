"""Scratch folders: where a writer builds a folder before renaming it into place.

    scratch = scratch_dir(final)           # .<final>.tmp-<pid>-<random>, beside final
    ...write into scratch...; os.replace(scratch, final)
    scratch_pid(".ckpt.tmp-4777-k2x9")     # 4777: the writer; None for other names

Every scratch name carries the writing process's pid (`.<final>.tmp-<pid>`, or with a random
tail where one process may build the same folder twice at once), so the next writer of a
workdir can remove what a writer killed outright left (sparrow.storage.layout's
remove_stale_scratch). Below every other module: checkpoints, exports and stage folders alike.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_SCRATCH = re.compile(r"^\..+\.tmp-(\d+)(?:-\w+)?$")


def scratch_dir(final: str | Path) -> Path:
    """A new, empty scratch folder beside `final`, unique even within one process. The caller
    renames it onto `final` when complete and removes it otherwise."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))


def scratch_pid(name: str) -> int | None:
    """The pid of the process that made the scratch file or folder `name`; None when `name`
    is not a scratch name."""
    match = _SCRATCH.match(name)
    return int(match.group(1)) if match else None
