"""The on-disk layout of a workdir, and write-then-rename helpers.

    <workdir>/sparrow.duckdb                      the mismatch history (sparrow/storage/schema.py)
    <workdir>/runs/<run_id>/step-<n>/<stage>/     one stage's outputs
    <workdir>/runs/<run_id>/checkpoints/step-<n>/ safetensors and optimizer state

A stage writes into a hidden sibling folder and renames it into place when complete, so a
crash never leaves a half-written stage folder where a reader (or a resume) would trust it.
A writer killed outright (kill -9, a lost node) leaves its scratch behind, named
`.<final>.tmp-<pid>` (or `.<final>.tmp-<pid>-<random>` where one process may write the same
folder twice at once: sparrow.scratch); the next writer removes those of dead processes when it
takes the workdir (remove_stale_scratch, called by Store.open_writer).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sparrow.scratch import scratch_pid

DB_FILENAME = "sparrow.duckdb"


@dataclass(frozen=True)
class RunLayout:
    workdir: Path
    run_id: str

    def __post_init__(self) -> None:
        if not self.run_id or "/" in self.run_id or self.run_id.startswith("."):
            raise ValueError(f"run id {self.run_id!r} must be a plain, non-empty name")
        object.__setattr__(self, "workdir", Path(self.workdir))

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / self.run_id

    def step_dir(self, step: int) -> Path:
        return self.run_dir / f"step-{step}"

    def stage_dir(self, step: int, stage: str) -> Path:
        return self.step_dir(step) / stage

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / "checkpoints" / f"step-{step}"

    def token_file(self, step: int) -> Path:
        return self.stage_dir(step, "aggregate_mismatch") / "tokens.parquet"


def db_path(workdir: str | Path) -> Path:
    return Path(workdir) / DB_FILENAME


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a scratch folder; on success it replaces `final` in one rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if final.exists():  # a stage that wrote its folder but died before recording itself
        shutil.rmtree(final)
    os.replace(scratch, final)


@contextmanager
def atomic_file(final: str | Path) -> Iterator[Path]:
    """Yield a scratch path beside `final`; on success it is renamed onto `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = final.parent / f".{final.name}.tmp-{os.getpid()}"
    try:
        yield scratch
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    os.replace(scratch, final)


def remove_stale_scratch(workdir: str | Path) -> list[Path]:
    """Remove the scratch folders and files under <workdir>/runs whose writing process is
    gone; returns what was removed. Call it holding the workdir's writer lock."""
    removed = []
    runs = Path(workdir) / "runs"
    for root, dirs, files in os.walk(runs):
        for name in [*dirs, *files]:
            pid = scratch_pid(name)
            if pid is None or process_alive(pid):
                continue
            path = Path(root) / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
        dirs[:] = [d for d in dirs if scratch_pid(d) is None]
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
