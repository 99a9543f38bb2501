"""Scratch folders of writers killed outright are found and removed by the next writer,
whichever helper made them (atomic_dir's `.<final>.tmp-<pid>` or scratch_dir's random one)."""

import os
import subprocess
import sys

from sparrow.scratch import scratch_dir
from sparrow.storage.layout import atomic_dir, remove_stale_scratch


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(child.stdout)


def test_scratch_dirs_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    step = tmp_path / "runs" / "r" / "step-2"
    live = scratch_dir(step / "policy_update")
    assert live.parent == step and live.name.startswith(f".policy_update.tmp-{os.getpid()}-")
    dead = _dead_pid()
    # a checkpoint written inside a stage's scratch folder, both left by a killed writer
    stage = step / f".policy_update.tmp-{dead}"
    stage.mkdir()
    nested = step / f"..policy_update.tmp-{dead}.tmp-{dead}-k2x9_q"
    nested.mkdir()
    (nested / "model.safetensors").write_bytes(b"half")
    older = step / f"..policy_update.tmp-{dead}-44hntqlb"  # the name checkpoints had before
    older.mkdir()
    kept = step / "policy_update-notes.tmp-x"  # not a scratch name
    kept.mkdir()

    removed = remove_stale_scratch(tmp_path)

    assert sorted(p.name for p in removed) == sorted([stage.name, nested.name, older.name])
    assert sorted(p.name for p in step.iterdir()) == sorted([live.name, kept.name])


def test_two_scratch_dirs_for_one_final_in_one_process_differ(tmp_path):
    assert scratch_dir(tmp_path / "ckpt") != scratch_dir(tmp_path / "ckpt")
    with atomic_dir(tmp_path / "stage") as scratch:
        (scratch / "a").write_text("1")
    assert (tmp_path / "stage" / "a").read_text() == "1"
