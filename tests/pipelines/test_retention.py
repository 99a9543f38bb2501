"""Checkpoint retention: old policy_update folders lose their tensors, the newest and every
N-th keep them, and the run's last policy still loads.

    python -m pytest tests/pipelines/test_retention.py -q
"""

from __future__ import annotations

import json


def test_old_policy_folders_are_pruned(flow_environment, small_overrides, tmp_path):
    from pipelines.train import train_flow

    flow_environment.start()
    workdir = tmp_path / "work"
    summary = train_flow(small_overrides(workdir, "k", "pipeline.steps=3",
                                         "pipeline.keep_checkpoints=1", "pipeline.keep_every=2",
                                         "pipeline.eval_every=0"), show_table=False)
    assert summary["status"] == "finished"
    folder = workdir / "runs" / "k"
    kept = {step: (folder / f"step-{step}" / "policy_update" / "model.safetensors").exists()
            for step in (1, 2, 3)}
    assert kept == {1: False, 2: True, 3: True}
    marker = json.loads((folder / "step-1" / "policy_update" / "pruned.json").read_text())
    assert "model.safetensors" in marker["removed"] and "optimizer.pt" in marker["removed"]
    # the checkpoint at the end is its own copy (hard links), untouched by pruning
    assert (folder / "checkpoints" / "step-3" / "model.safetensors").exists()
