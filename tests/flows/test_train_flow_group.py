"""The train flow with a trainer group (trainer.num_workers=2, gloo on CPU) and two rollout
actors: the weights reach the actors by broadcast, the policy folders hold optimizer shards,
a run that failed mid-update resumes in the flow's process (trainer.num_workers=0) from the
2-rank folder, and then on one rank from that process's folder.

Marked slow (Ray actors for 2 ranks and 2 engines, three flow runs; a few minutes on 2 cores).
Run: `python -m pytest tests/flows/test_train_flow_group.py -q`.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.trainer.sharded_checkpoint import SHARDED_STATE

pytestmark = pytest.mark.slow


def changed(before, after) -> bool:
    """Some weight differs (a tied lm_head.weight may be written by one and not the other)."""
    first, second = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    return any(not (first[k] == second[k]).all() for k in first.keys() & second.keys())


def test_group_of_two_then_resume_in_one_process_then_on_one_rank(
    flow_environment, small_overrides, tmp_path
):
    flow_environment.start()
    workdir = tmp_path / "work"
    # the engines take prompts as they run (the default dispatch); the next test uses items
    group = ("trainer.num_workers=2", "rollout.num_actors=2")
    with pytest.raises(StageFailedOnPurpose, match="policy_update.*step 2"):
        train_flow(
            small_overrides(workdir, "g", *group, "pipeline.fail_at=policy_update@2"),
            show_table=False,
        )
    run = workdir / "runs" / "g"
    step1 = run / "step-1" / "policy_update"
    assert (step1 / SHARDED_STATE).is_dir() and not (step1 / "optimizer.pt").exists()
    assert json.loads((run / "step-1" / "sync_weights" / "synced.json").read_text())["modes"] == [
        "gloo",
        "gloo",
    ]

    # the flow's own PolicyTrainer resumes from the 2-rank shards and writes optimizer.pt
    with pytest.raises(StageFailedOnPurpose, match="policy_update.*step 3"):
        train_flow(
            small_overrides(
                workdir,
                "g",
                "trainer.num_workers=0",
                "pipeline.steps=3",
                "pipeline.fail_at=policy_update@3",
            ),
            show_table=False,
        )
    step2 = run / "step-2" / "policy_update"
    assert (step2 / "optimizer.pt").is_file() and not (step2 / SHARDED_STATE).exists()
    assert changed(step1, step2)

    # and one rank resumes from that folder and finishes the run
    summary = train_flow(
        small_overrides(workdir, "g", "trainer.num_workers=1", "pipeline.steps=3"), show_table=False
    )
    assert summary["resumed"] and summary["status"] == "finished"
    assert summary["stages_run"]["policy_update"] == 1
    synced = json.loads((run / "step-3" / "sync_weights" / "synced.json").read_text())
    assert synced["modes"] == ["gloo"]
    assert changed(step2, run / "step-3" / "policy_update")


def test_distill_and_offload_with_a_group_then_resume_in_one_process(
    flow_environment, small_overrides, tmp_path
):
    flow_environment.start()
    workdir = tmp_path / "work"
    group = (
        "trainer.num_workers=2",
        "rollout.num_actors=2",
        "rollout.work_item_prompts=1",
        "trainer.offload_during_rollout=true",
        "algo.distill.enabled=true",
        "algo.lr=1e-6",
        "algo.distill.lr_scale=1000",
        "pipeline.eval_every=0",
    )
    with pytest.raises(StageFailedOnPurpose, match="distill_lora.*step 2"):
        train_flow(
            small_overrides(workdir, "d", *group, "pipeline.fail_at=distill_lora@2"),
            show_table=False,
        )
    run = workdir / "runs" / "d"
    step1 = run / "step-1" / "distill_lora"
    assert json.loads((step1 / "distill_state.json").read_text())["updates"] == 1
    synced = json.loads((run / "step-1" / "sync_weights" / "synced.json").read_text())
    assert synced["modes"] == ["gloo", "gloo"] and synced["adapter_path"] == str(step1)

    # the flow's own distiller resumes from the folder rank 0 wrote
    summary = train_flow(
        small_overrides(workdir, "d", *group[1:], "trainer.num_workers=0"), show_table=False
    )
    assert summary["resumed"] and summary["status"] == "finished"
    assert summary["stages_run"]["distill_lora"] == 1
    step2 = run / "step-2" / "distill_lora"
    assert json.loads((step2 / "distill_state.json").read_text())["updates"] == 2
    assert changed_adapter(step1, step2)


def changed_adapter(before, after) -> bool:
    first = load_file(before / "adapter.safetensors")
    second = load_file(after / "adapter.safetensors")
    return any(not (first[k] == second[k]).all() for k in first)
