"""A full disk in a stage: one DiskFullError naming the path and the space needed, nothing
half-written kept or recorded, and the same stage runs once space is freed. The writes are
real (a Parquet file, torch.save, a DuckDB commit) on a small tmpfs mounted for the test (root
only: skipped elsewhere); the ENOSPC classification itself is tested without one.

Run: `python -m pytest tests/runtime/ledger/test_disk_full.py -q`.
"""

from __future__ import annotations

import errno
import re
import subprocess
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparrow.errors import DiskFullError, is_disk_full
from sparrow.runtime.ledger.stage import StageWrite, run_stage
from sparrow.storage import RunLayout, Store, query

SIZE = 16 << 20


@pytest.fixture
def disk(tmp_path):
    """A tmpfs of SIZE bytes, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk, leave: int) -> None:
    """Fill the disk but `leave` bytes with a balloon file."""
    import shutil

    free = shutil.disk_usage(disk).free
    with open(disk / "balloon", "ab") as f:
        f.write(b"\0" * max(0, free - leave))


def runtime_on(workdir):
    return SimpleNamespace(
        run_id="r",
        store=Store.open_writer(workdir),
        layout=RunLayout(workdir, "r"),
        fail_at=None,
        kill_at=None,
        stages_run=Counter(),
        tracker=None,
    )


def write_parquet(out):
    values = np.random.default_rng(0).random(400_000)  # 3.2 MB that do not compress
    pq.write_table(pa.table({"x": values}), out / "rollouts.parquet", compression=None)
    return StageWrite()


def write_torch(out):
    torch.save({"w": torch.rand(800_000)}, out / "optimizer.pt")
    return StageWrite()


def recorded(workdir) -> list[tuple]:
    return query(workdir, "SELECT step, stage FROM stage_runs").rows


@pytest.mark.parametrize("body", [write_parquet, write_torch], ids=["parquet", "torch.save"])
def test_a_full_disk_in_a_stage_is_one_error_and_the_stage_runs_once_freed(disk, body):
    workdir = disk / "w"
    runtime = runtime_on(workdir)
    run_stage(runtime, "rollout", 1, body)  # step 1 fits: step 2 will need as much
    fill(disk, 512 << 10)
    with pytest.raises(DiskFullError) as caught:
        run_stage(runtime, "rollout", 2, body)
    message = str(caught.value)
    assert message.startswith(
        f"no space left on device writing {runtime.layout.stage_dir(2, 'rollout')}"
    )
    assert re.search(
        r"MiB free on its filesystem, about 3\.\d MiB needed \(what rollout wrote at step 1\)",
        message,
    )
    assert recorded(workdir) == [(1, "rollout")]
    assert sorted(p.name for p in (workdir / "runs" / "r").iterdir()) == ["step-1", "step-2"]
    assert list((workdir / "runs" / "r" / "step-2").iterdir()) == []  # no scratch kept
    (disk / "balloon").unlink()
    outcome = run_stage(runtime, "rollout", 2, body)
    assert not outcome.skipped and recorded(workdir) == [(1, "rollout"), (2, "rollout")]
    runtime.store.close()


def test_a_full_disk_at_the_duckdb_commit_names_the_database(disk):
    workdir = disk / "w"
    runtime = runtime_on(workdir)
    many = {f"m/{i}": float(i) for i in range(20)}
    fill(disk, 0)  # not a page left for the WAL
    with pytest.raises(DiskFullError) as caught:
        run_stage(runtime, "reward", 1, lambda out: StageWrite(metrics=many))
    assert str(caught.value).startswith(
        f"no space left on device writing {workdir / 'sparrow.duckdb'}"
    )
    (disk / "balloon").unlink()
    outcome = run_stage(runtime, "reward", 1, lambda out: StageWrite(metrics=many))
    assert not outcome.skipped and recorded(workdir) == [(1, "reward")]
    count = query(workdir, "SELECT count(*) FROM step_metrics").rows
    assert count == [(len(many) + 1,)]  # and the time, once each
    runtime.store.close()


def test_what_counts_as_a_full_disk(tmp_path):
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert is_disk_full(wrapped, tmp_path)
    assert is_disk_full(Exception("I/O error: No space left on device (os error 28)"), tmp_path)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path)
    # torch's short write says nothing of the disk: only a nearly full one counts
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert is_disk_full(short, tmp_path) == (
        __import__("shutil").disk_usage(tmp_path).free < (64 << 20)
    )
