"""Two steps of the train flow on one GPU at a reduced Qwen3-1.7B shape (marked gpu).

    python -m pytest tests/flows/test_train_flow_gpu.py -q      # on a GPU machine

A random-weight model with 1.7B's layer shapes and real vocabulary but 4 layers, sparse
rollout under qwen3-1.7b-0.86 with eos off, the trainer and the rollout actor sharing the
GPU: the KV cache is sized from device memory, freed after each rollout and allocated again
for the next, the weights reach the actor over CUDA IPC, and the stage outputs are complete.
The second test runs three steps one-step-off (pipeline.max_staleness=1) on the same GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STAGES = (
    "rollout",
    "reward",
    "dense_score",
    "aggregate_mismatch",
    "reoptimize_schedule",
    "policy_update",
    "sync_weights",
    "checkpoint",
)


@pytest.fixture(scope="module")
def model_1p7b_4_layers(tmp_path_factory):
    from sparrow.model.random_checkpoint import make_random_checkpoint

    return make_random_checkpoint(
        tmp_path_factory.mktemp("q17") / "model",
        "qwen3",
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=4,
        num_q_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=6144,
        rope_theta=1_000_000.0,
        max_position_embeddings=8192,
        seed=0,
    )


def _sparse_run(model, workdir, run_id: str, steps: int, *overrides: str) -> dict:
    """`steps` steps of the train flow, sparse under qwen3-1.7b-0.86 with eos off (2 prompts x 4
    samples, `overrides` on top), finished with the first seven stages of every step recorded;
    its step metrics by (step, name)."""
    from sparrow.flows.train import train_flow
    from sparrow.storage.query import query

    shared = (
        f"model.path={model}",
        f"pipeline.workdir={workdir}",
        f"pipeline.run_id={run_id}",
        f"pipeline.steps={steps}",
        "data.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.ignore_eos=true",
        "data.reward=test_char_code",
        "schedule.name=qwen3-1.7b-0.86",
        "algo.lr=1e-4",
        "trainer.gradient_checkpointing=true",
    )
    summary = train_flow([*shared, *overrides], show_table=False)
    assert summary["status"] == "finished"
    sql = "SELECT step, stage FROM stage_runs WHERE run_id = ?"
    recorded = {(r["step"], r["stage"]) for r in query(workdir, sql, [run_id]).as_dicts()}
    assert recorded >= {(s, st) for s in range(1, steps + 1) for st in STAGES[:7]}
    sql = "SELECT step, name, value FROM step_metrics WHERE run_id = ?"
    return {(r["step"], r["name"]): r["value"] for r in query(workdir, sql, [run_id]).as_dicts()}


def test_two_sparse_steps_share_the_gpu(flow_environment, tmp_path, model_1p7b_4_layers):
    from safetensors.torch import load_file

    flow_environment.start()
    workdir = tmp_path / "work"
    metrics = _sparse_run(
        model_1p7b_4_layers,
        workdir,
        "g",
        2,
        "rollout.max_new_tokens=1024",
        "rollout.gpu_memory_utilization=0.5",
    )
    for step in (1, 2):
        assert metrics[(step, "rollout/tokens")] == 2 * 4 * 1024  # eos off: every sample full
        assert metrics[(step, "sync/ipc_actors")] == 1.0  # weights over CUDA IPC
        assert metrics[(step, "actor/grad_norm")] > 0
        # the KV cache was allocated for the rollout (its peak) and freed before the update
        assert metrics[(step, "memory/rollout_peak_gib")] > 1.0
        assert metrics[(step, "memory/update_peak_gib")] > 0
        assert (
            metrics[(step, "memory/engine_after_release_gib")]
            < 0.25 * metrics[(step, "memory/rollout_peak_gib")]
        )
    before = load_file(str(model_1p7b_4_layers / "model.safetensors"))
    # on GPU the trainer's state is written in the background beside the stage folders
    assert (workdir / "runs" / "g" / "step-2" / "policy_update" / "state.json").is_file()
    after = load_file(str(workdir / "runs" / "g" / "step-2" / "policy_state" / "model.safetensors"))
    changed = [
        name for name in before if not torch.equal(before[name].float(), after[name].float())
    ]
    assert len(changed) > len(before) // 2


def test_one_step_off_shares_the_gpu_and_trains_on_the_version_before(
    flow_environment, tmp_path, model_1p7b_4_layers
):
    """pipeline.max_staleness=1 on one GPU (docs/async.md): the rollout of step n+1 runs on
    the engine while the trainer scores and updates step n beside it; the engine keeps its
    KV cache through them; steps 1, 2 and 3 train on samples of versions 0, 0 and 1, and
    scoring counts the stale samples."""
    from sparrow.storage.query import query

    flow_environment.start()
    workdir = tmp_path / "work"
    metrics = _sparse_run(
        model_1p7b_4_layers,
        workdir,
        "p",
        3,
        "pipeline.max_staleness=1",
        "pipeline.keep_checkpoints=2",
        "rollout.max_new_tokens=512",
        "rollout.gpu_memory_utilization=0.4",
    )
    assert [metrics[(s, "rollout/policy_version")] for s in (1, 2, 3)] == [0, 0, 1]
    assert [metrics[(s, "dense/stale_samples")] for s in (1, 2, 3)] == [0, 8, 8]
    for step in (1, 2, 3):
        assert metrics[(step, "rollout/tokens")] == 2 * 4 * 512  # eos off: every sample full
        assert metrics[(step, "actor/grad_norm")] > 0
        assert 0 < metrics[(step, "mismatch/acceptance_mean")] <= 1
    # rollouts 2 and 3 were generated in flight, beside the step before's update
    folders = query(
        workdir,
        "SELECT output_dir FROM stage_runs WHERE run_id = 'p' AND stage = 'rollout' AND step > 1",
    ).as_dicts()
    launches = [json.loads((Path(r["output_dir"]) / "launch.json").read_text()) for r in folders]
    assert len(launches) == 2
    assert all(launch["in_flight"] for launch in launches), launches
