"""Checkpoint retention, and repair of policy states a crash kept from the disk.

    prune_policy_folders(runtime, step)      # after step's policy_update is recorded
    repair_unsaved_policies(runtime)         # when a run resumes

Every step's policy_update folder holds the full trainer (fp32 weights and AdamW moments:
about 20 GB at Qwen3-1.7B), and a run of hundreds of steps cannot keep them all. After step n
is recorded, the folders of steps m <= n - pipeline.keep_checkpoints lose their tensor files
(model*.safetensors, optimizer.pt or a trainer group's sharded_state/, rng_state.pt), unless
m is a multiple of pipeline.keep_every; the small JSON files stay, with pruned.json saying
what went. A resume reads the newest recorded folder, which is never pruned
(keep_checkpoints >= 1); the checkpoint stage's folders are hard links, so they keep their
own copy.
The tensor files are renamed into the folder's TRASH subfolder (a rename, at once) and a
worker thread deletes them: freeing 20 GB of extents while the next background save writes
20 GB to the same disk is seconds of I/O that would otherwise sit between policy_update and
sync_weights (13-15 s a step in the 8K long run on the H100). wait_for_deletions() joins the
worker (the flow calls it when a run closes); a TRASH left by a process that died is deleted
when a run resumes (repair_unsaved_policies).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sparrow.runtime.run_runtime import RunRuntime
from sparrow.storage.run_rows import stage_records

HEAVY = (
    "*.safetensors",
    "optimizer.pt",
    "rng_state.pt",
    "*.safetensors.index.json",
    "sharded_state",
)
MARKER = "pruned.json"
TRASH = ".pruned-tensors"

_deleter: ThreadPoolExecutor | None = None
_pending: list[Future] = []
_lock = threading.Lock()


def _delete_later(trash: Path) -> None:
    global _deleter
    with _lock:
        if _deleter is None:
            _deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retention")
        _pending.append(_deleter.submit(shutil.rmtree, trash, True))


def wait_for_deletions() -> None:
    """Block until every tensor file pruning handed to the worker is deleted."""
    with _lock:
        pending = list(_pending)
        _pending.clear()
    for future in pending:
        future.result()


def prune_policy_folders(runtime: RunRuntime, step: int) -> list[Path]:
    """Prune what the retention settings let go; returns the folders pruned now."""
    keep, every = runtime.cfg.pipeline.keep_checkpoints, runtime.cfg.pipeline.keep_every
    if keep <= 0:
        return []
    pruned = []
    for record in stage_records(runtime.store, runtime.run_id):
        if record.stage != "policy_update" or record.step > step - keep:
            continue
        if every and record.step % every == 0:
            continue
        # no wait: this runs right after a step's background save started, and joining it
        # here would keep the write from overlapping the next rollout; an older step's
        # save is complete (one save is in flight at a time), and an unfinished one has no
        # config.json yet and is left alone
        folder = runtime.policy_state(record.output_dir, wait=False)
        if (folder / "config.json").is_file() and not (folder / MARKER).exists():
            clock = time.perf_counter()
            removed = [p.name for pattern in HEAVY for p in folder.glob(pattern)]
            trash = folder / TRASH
            trash.mkdir(exist_ok=True)
            for name in removed:
                (folder / name).rename(trash / name)
            (folder / MARKER).write_text(
                json.dumps(
                    {
                        "after_step": step,
                        "removed": removed,
                        "seconds": round(time.perf_counter() - clock, 4),
                    }
                )
            )
            _delete_later(trash)
            pruned.append(folder)
    return pruned


def repair_unsaved_policies(runtime: RunRuntime) -> list[int]:
    """Steps whose policy_update was recorded but whose background-written state never
    reached the disk (the process died first): their policy_update, sync_weights and
    checkpoint records are dropped so the resumed flow runs them again (same inputs, same
    update). Returns those steps."""
    from sparrow.storage.run_rows import forget_stages

    lost = []
    for record in stage_records(runtime.store, runtime.run_id):
        if record.stage != "policy_update":
            continue
        state = runtime.policy_state(record.output_dir, wait=False)
        if (state / TRASH).is_dir():  # pruned, but the process died before deleting
            shutil.rmtree(state / TRASH, ignore_errors=True)
        if not (state / "config.json").is_file() and not (state / MARKER).exists():
            lost.append(record.step)
    for step in lost:
        forget_stages(
            runtime.store, runtime.run_id, step, ("policy_update", "sync_weights", "checkpoint")
        )
    return lost
