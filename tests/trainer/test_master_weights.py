"""MasterWeights: bf16 parameters stepped through fp32 masters, and the trainer that uses them.

python -m pytest tests/trainer/test_master_weights.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.trainer.master_weights import MasterWeights
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.test_policy_trainer import make_records, rollout_step

ALGO = AlgoConfig(lr=1e-3, grad_clip=0.0, tis_cap=2.0)
SYSTEM = TrainerConfig(micro_batch_tokens=10_000)


def tied_net():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(11, 6)
    head = torch.nn.Linear(6, 11, bias=False)
    head.weight = embed.weight  # tied, as Qwen3's embeddings and lm_head
    return torch.nn.Sequential(embed, torch.nn.Linear(6, 6), head)


def test_gradients_sum_in_fp32_on_one_master_per_parameter():
    net = tied_net()
    reference = [p.detach().clone() for p in net.parameters()]
    masters = MasterWeights(net, torch.bfloat16)
    assert len(masters.parameters()) == 3  # the tied weight is one parameter, one master
    assert all(p.dtype == torch.bfloat16 for p in net.parameters())
    assert all(torch.equal(m, r) for m, r in zip(masters.parameters(), reference))
    ids = torch.tensor([1, 4, 7])
    by_hand = [torch.zeros_like(m) for m in masters.parameters()]
    for _ in range(2):  # two micro-batches
        net(ids).float().square().mean().backward()
    # the same two backward passes, bf16 gradients added by hand in fp32
    net_again = tied_net()
    for p in net_again.parameters():
        p.data = p.data.to(torch.bfloat16)
    for _ in range(2):
        net_again.zero_grad()
        net_again(ids).float().square().mean().backward()
        for acc, p in zip(by_hand, net_again.parameters()):
            acc.add_(p.grad.float())
    for master, want in zip(masters.parameters(), by_hand):
        assert master.grad.dtype == torch.float32
        torch.testing.assert_close(master.grad, want)
    assert all(p.grad is None for p in net.parameters())  # no bf16 gradient is kept


def test_a_small_update_lands_on_the_master_and_publish_rounds_it():
    net = torch.nn.Linear(4, 4, bias=False)
    original = net.weight.detach().clone()
    masters = MasterWeights(net, torch.bfloat16)
    (master,) = masters.parameters()
    before = net.weight.detach().clone()
    with torch.no_grad():
        master.add_(1e-6)  # far below bf16's resolution near these weights
    masters.publish()
    assert torch.equal(net.weight, before)  # the bf16 copy cannot show it
    assert torch.equal(master, original + 1e-6)  # the master keeps it
    with masters.swapped_in() as model:
        assert model.weight.dtype == torch.float32 and torch.equal(model.weight, master)
    assert net.weight.dtype == torch.bfloat16


def test_trainer_holds_bf16_and_saves_the_fp32_masters(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="bfloat16", seed=3, trainer_config=SYSTEM
    )
    assert trainer.masters is not None
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    start = [m.clone() for m in trainer.masters.parameters()]
    rollout_step(trainer, make_records(seed=2), [0, 1, 0, 1, 1, 0], 3)
    moved = [not torch.equal(a, b) for a, b in zip(start, trainer.masters.parameters())]
    assert sum(moved) > len(moved) // 2
    published = [p.float() for p in trainer.model.parameters()]
    for m, p in zip(trainer.masters.parameters(), published):
        assert torch.equal(m.to(torch.bfloat16).float(), p)
    folder = trainer.save(tmp_path / "ckpt")
    saved = load_file(str(folder / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    names = dict(trainer.model.named_parameters())
    for name, master in zip(names, trainer.masters.parameters()):
        if name in saved:
            assert torch.equal(saved[name], master)
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())


def test_resume_with_master_weights_is_exact(qwen3_checkpoint, tmp_path):
    records = make_records(seed=4)
    straight = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="bfloat16", seed=1, trainer_config=SYSTEM
    )
    rollout_step(straight, records, [0, 1, 0, 1, 1, 0], 3)
    straight.save(tmp_path / "ckpt")
    want = rollout_step(straight, records, [1, 1, 0, 0, 0.5, 0], 3)
    resumed = PolicyTrainer.load(
        tmp_path / "ckpt", ALGO, device="cpu", dtype="bfloat16", trainer_config=SYSTEM
    )
    got = rollout_step(resumed, records, [1, 1, 0, 0, 0.5, 0], 3)
    assert got == want
    for a, b in zip(straight.masters.parameters(), resumed.masters.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("master_weights", [True, False])
def test_bf16_update_moves_logprobs_the_same_way_either_way(qwen3_checkpoint, master_weights):
    system = dataclasses.replace(SYSTEM, master_weights=master_weights)
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="bfloat16", seed=0, trainer_config=system
    )
    assert (trainer.masters is not None) == master_weights
    records = make_records(prompts=2, group=2, seed=1)
    rewards = [1.0, 0.0, 0.0, 1.0]
    before = trainer.score(records)
    rollout_step(trainer, records, rewards, 2)
    after = trainer.score(records)
    for i, reward in enumerate(rewards):
        gained = sum(after[i].dense_logprobs) - sum(before[i].dense_logprobs)
        assert (gained > 0) == (reward == 1.0)
