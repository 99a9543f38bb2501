"""ShardedPolicyTrainer on 2 gloo ranks (CPU) equals one process's PolicyTrainer: scores,
the update's weights and metrics, and the exported checkpoint folder.

    python -m pytest tests/trainer/test_sharded_trainer.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparrow.config.schema import TrainerConfig
from sparrow.model import load_model
from sparrow.model.attention import causal_attention
from sparrow.trainer.policy_trainer import PolicyTrainer
from sparrow.trainer.sharded import shares
from tests.trainer.sharded_workers import run_ranks
from tests.trainer.test_policy_trainer import ALGO, make_records, weights, with_actor_logprobs


def test_shares_keep_prompts_whole_and_balance_tokens():
    records = make_records(prompts=5, group=3, seed=11)
    parts = shares(records, 2)
    assert sorted(i for part in parts for i in part) == list(range(len(records)))
    owners = [{records[i].prompt_index for i in part} for part in parts]
    assert not owners[0] & owners[1] and all(owners)
    loads = [sum(records[i].total_length for i in part) for part in parts]
    longest = max(sum(r.total_length for r in records if r.prompt_index == p) for p in range(5))
    assert abs(loads[0] - loads[1]) <= longest
    assert shares(records[:3], 2)[1] == []  # one prompt: the second rank idles


@pytest.mark.parametrize(
    "fixture, checkpointing",
    [
        ("qwen3_checkpoint", False),
        ("qwen3_sharded_checkpoint", False),
        ("llama_checkpoint", False),
        ("qwen3_checkpoint", True),
    ],
)
def test_two_gloo_ranks_equal_one_process(fixture, checkpointing, request, tmp_path):
    """Tied embeddings in one file, the same in three files (rank 0 broadcasts them file by
    file), untied with llama3 RoPE scaling (buffers kept through the meta-device init); and
    ranks that recompute each layer in the backward (trainer.gradient_checkpointing under FSDP)
    against one process that keeps its activations."""
    qwen3_checkpoint = request.getfixturevalue(fixture)
    # one sequence per micro-batch: the ranks hold 4 and 2 sequences, so one rank pads
    algo = dataclasses.replace(ALGO, grad_clip=0.05)
    system = TrainerConfig(micro_batch_tokens=1)
    records = make_records(prompts=3, group=2, seed=12)
    rewards = [0.0, 1.0, 1.0, 0.5, 0.2, 0.0]
    single = PolicyTrainer(qwen3_checkpoint, algo, device="cpu", seed=0, trainer_config=system)
    before = weights(single)
    scores = single.score(records)
    update_records = with_actor_logprobs(records, scores, [0.1 * (i % 3) for i in range(6)])
    old = [s.dense_logprobs for s in scores]
    run_ranks(
        2,
        qwen3_checkpoint,
        algo,
        dataclasses.replace(system, gradient_checkpointing=checkpointing),
        records,
        update_records,
        rewards,
        old,
        2,
        tmp_path,
    )
    expected = single.update(update_records, rewards, old, 2)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)

    for want, have in zip(scores, got["scores"]):
        for field in ("dense_logprobs", "acceptance", "leftover_mass"):
            torch.testing.assert_close(
                torch.tensor(getattr(have, field)),
                torch.tensor(getattr(want, field)),
                rtol=0,
                atol=1e-5,
            )
    assert abs(expected["actor/loss"]) > 1e-3
    assert expected["actor/grad_norm"] > algo.grad_clip  # the clip is active
    assert set(got["metrics"]) == set(expected)
    for key, value in expected.items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    want_w = weights(single)
    assert set(got["weights"]) >= set(want_w) - {"lm_head.weight"}  # tied to the embeddings
    moved = 0
    for name, tensor in got["weights"].items():
        # AdamW's first step is about lr = 1e-3 per entry; gradients summed in another order
        # move entries whose gradient is near AdamW's eps by a few 1e-6 (test_trainer.py)
        torch.testing.assert_close(tensor, want_w[name], rtol=0, atol=1e-5)
        moved += int((tensor != before[name]).sum())
    assert moved > 0

    # the exported optimizer state is one process's: exp_avg = (1 - beta1) x the clipped
    # gradient, so a mean over ranks instead of the sum would be half of it
    exported = torch.load(tmp_path / "export" / "optimizer.pt", weights_only=True)
    single_state = single.optimizer.state_dict()
    assert exported["param_groups"][0]["params"] == single_state["param_groups"][0]["params"]
    for index, state in single_state["state"].items():
        scale = float(state["exp_avg"].abs().max())
        torch.testing.assert_close(
            exported["state"][index]["exp_avg"], state["exp_avg"], rtol=1e-4, atol=1e-5 * scale
        )
        assert float(exported["state"][index]["step"]) == 1

    # the exported folder: the engine's logits equal the single-process trainer's
    ids = torch.tensor([5, 17, 200, 3, 99, 42])
    with torch.no_grad():
        want = single.model(input_ids=ids[None]).logits[0]
        decoder = load_model(tmp_path / "export")
        have = decoder.compute_logits(decoder(ids, torch.arange(6), causal_attention([6])))
    torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)

    # and one process resumes from it: a second update lands where the single trainer's does
    resumed = PolicyTrainer.load(
        tmp_path / "export", algo, device="cpu", dtype="auto", trainer_config=system
    )
    assert resumed.step == 1 and resumed.optimizer_steps == 1
    second = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
    single.update(update_records, second, old, 2)
    resumed.update(update_records, second, old, 2)
    resumed_w = weights(resumed)
    for name, tensor in weights(single).items():
        torch.testing.assert_close(resumed_w[name], tensor, rtol=0, atol=2e-5)
