"""Checkpoint retention, and repair of policy states a crash kept from the disk.

    prune_policy_folders(runtime, step)      # after step's policy_update is recorded
    repair_unsaved_policies(runtime)         # when a run resumes

Every step's policy_update folder holds the full trainer (fp32 weights and AdamW moments:
about 20 GB at Qwen3-1.7B), and a run of hundreds of steps cannot keep them all. After step n
is recorded, the folders of steps m <= n - pipeline.keep_checkpoints lose their tensor files
(model*.safetensors, optimizer.pt, rng_state.pt), unless m is a multiple of
pipeline.keep_every; the small JSON files stay, with pruned.json saying what went. A resume
reads the newest recorded folder, which is never pruned (keep_checkpoints >= 1); the
checkpoint stage's folders are hard links, so they keep their own copy.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.records import stage_records
from tasks.runtime import RunRuntime

HEAVY = ("*.safetensors", "optimizer.pt", "rng_state.pt", "*.safetensors.index.json")
MARKER = "pruned.json"


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
            removed = [p.name for pattern in HEAVY for p in folder.glob(pattern)]
            for name in removed:
                (folder / name).unlink()
            (folder / MARKER).write_text(json.dumps({"after_step": step, "removed": removed}))
            pruned.append(folder)
    return pruned


def repair_unsaved_policies(runtime: RunRuntime) -> list[int]:
    """Steps whose policy_update was recorded but whose background-written state never
    reached the disk (the process died first): their policy_update, sync_weights and
    checkpoint records are dropped so the resumed flow runs them again (same inputs, same
    update). Returns those steps."""
    from tasks.records import forget_stages

    lost = []
    for record in stage_records(runtime.store, runtime.run_id):
        if record.stage != "policy_update":
            continue
        state = runtime.policy_state(record.output_dir, wait=False)
        if not (state / "config.json").is_file() and not (state / MARKER).exists():
            lost.append(record.step)
    for step in lost:
        forget_stages(runtime.store, runtime.run_id, step,
                      ("policy_update", "sync_weights", "checkpoint"))
    return lost
