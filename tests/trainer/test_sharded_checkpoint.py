"""A trainer group's checkpoint (2 gloo ranks, optimizer shards under sharded_state/) resumes
in one process without a process group: PolicyTrainer.load holds exactly the group's AdamW
state, in its own parameter order (fp32, or on bf16's fp32 masters), and its next update is
the one the group made, and the one a single process that never stopped makes.

Marked slow (two spawned rank processes, about 25 s on 2 cores).
Run: `python -m pytest tests/trainer/test_sharded_checkpoint.py -q`.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.distributed as dist

from sparrow.config.schema import TrainerConfig
from sparrow.trainer.checkpoint import TrainerCheckpointError
from sparrow.trainer.policy_trainer import PolicyTrainer
from sparrow.trainer.sharded_checkpoint import SHARDED_STATE
from tests.trainer.sharded_workers import run_ranks, save_then_update
from tests.trainer.test_policy_trainer import ALGO, make_records, weights, with_actor_logprobs

pytestmark = pytest.mark.slow

# one sequence per micro-batch (the ranks hold 4 and 2 sequences) and an active clip, as in
# test_sharded_trainer.py
GROUP_ALGO = dataclasses.replace(ALGO, grad_clip=0.05)
GROUP_SYSTEM = TrainerConfig(micro_batch_tokens=1)
REWARDS = ([0.0, 1.0, 1.0, 0.5, 0.2, 0.0], [1.0, 0.0, 0.0, 1.0, 0.5, 0.5])


def moments_close(have: dict, want: dict) -> None:
    """AdamW state of one process (numbered parameters): steps equal, moments within 1e-5 of
    each tensor's largest entry (gradients summed over ranks in another order)."""
    assert have.keys() == want.keys()
    for index, state in want.items():
        assert have[index].keys() == state.keys()
        assert torch.equal(have[index]["step"], state["step"]), index
        for key in ("exp_avg", "exp_avg_sq"):
            scale = float(state[key].abs().max())
            torch.testing.assert_close(
                have[index][key],
                state[key],
                rtol=0,
                atol=1e-5 * scale,
                msg=f"parameter {index} {key}",
            )


def test_one_process_resumes_two_ranks_shards(qwen3_checkpoint, qwen3_gqa3_checkpoint, tmp_path):
    records = make_records(prompts=3, group=2, seed=12)
    single = PolicyTrainer(
        qwen3_checkpoint, GROUP_ALGO, device="cpu", seed=0, trainer_config=GROUP_SYSTEM
    )
    scores = single.score(records)
    update_records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(6)])
    old = [s.dense_logprobs for s in scores]
    run_ranks(
        2,
        qwen3_checkpoint,
        GROUP_ALGO,
        GROUP_SYSTEM,
        update_records,
        REWARDS,
        old,
        2,
        tmp_path,
        body=save_then_update,
    )
    folder = tmp_path / "sharded"
    assert (folder / SHARDED_STATE).is_dir() and not (folder / "optimizer.pt").exists()

    resumed = PolicyTrainer.load(
        folder, GROUP_ALGO, device="cpu", dtype="auto", trainer_config=GROUP_SYSTEM
    )
    assert not dist.is_initialized()
    assert resumed.step == 1 and resumed.optimizer_steps == 1
    # every moment on its own parameter: bit for bit the group's state gathered in one
    # process's order (export's optimizer.pt, ShardedPolicyTrainer.full_optimizer_state)
    exported = torch.load(tmp_path / "export" / "optimizer.pt", weights_only=True)
    loaded = resumed.optimizer.state_dict()
    assert loaded["param_groups"][0]["params"] == exported["param_groups"][0]["params"]
    assert loaded["state"].keys() == exported["state"].keys()
    for index, state in exported["state"].items():
        for key, tensor in state.items():
            assert torch.equal(loaded["state"][index][key], tensor), (index, key)

    # bf16 with fp32 master weights (a GPU's "auto"): the same moments, on the masters
    masters = PolicyTrainer.load(
        folder, GROUP_ALGO, device="cpu", dtype="bfloat16", trainer_config=GROUP_SYSTEM
    )
    assert masters.masters is not None
    on_masters = masters.optimizer.state_dict()["state"]
    assert all(
        torch.equal(on_masters[i][k], loaded["state"][i][k])
        for i in loaded["state"]
        for k in loaded["state"][i]
    )

    # the next update is the group's second one (weights and moments)
    before = weights(resumed)
    resumed.update(update_records, REWARDS[1], old, 2)
    continued = torch.load(tmp_path / "continued.pt", weights_only=False)
    after = weights(resumed)
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the update moved them
    for name, tensor in continued["weights"].items():
        torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-5, msg=name)
    moments_close(resumed.optimizer.state_dict()["state"], continued["optimizer"]["state"])
    # and the one a single process that never stopped makes
    for rewards in REWARDS:
        single.update(update_records, rewards, old, 2)
    for name, tensor in weights(single).items():
        torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-5, msg=name)
    moments_close(resumed.optimizer.state_dict()["state"], single.optimizer.state_dict()["state"])

    # a lost shard file and shards of another model are named errors
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    next((broken / SHARDED_STATE).glob("__1_*.distcp")).unlink()
    with pytest.raises(TrainerCheckpointError, match="unreadable: FileNotFoundError.*__1_"):
        PolicyTrainer.load(
            broken, GROUP_ALGO, device="cpu", dtype="auto", trainer_config=GROUP_SYSTEM
        )
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(qwen3_gqa3_checkpoint / name, other / name)
    with pytest.raises(
        TrainerCheckpointError,
        match=r"do not fit this model: parameters \['model.layers.0.self_attn",
    ):
        PolicyTrainer.load(
            other, GROUP_ALGO, device="cpu", dtype="auto", trainer_config=GROUP_SYSTEM
        )
