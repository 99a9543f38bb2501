"""PolicyTrainer on a CUDA device: bf16 compute over fp32 master weights (marked gpu).

python -m pytest tests/trainer/test_policy_trainer_gpu.py -q     # on a GPU machine
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.data.rollouts import RolloutRecord
from sparrow.model import causal_attention, load_model
from sparrow.trainer.policy_trainer import PolicyTrainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ALGO = AlgoConfig(lr=1e-3, grad_clip=1.0)
SYSTEM = TrainerConfig(micro_batch_tokens=64)


def make_records(seed=0, prompts=2, group=2, vocab=384):
    rng = random.Random(seed)
    records = []
    for p in range(prompts):
        prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(2, 6)))
        for s in range(group):
            out = tuple(rng.randrange(vocab) for _ in range(rng.randint(3, 9)))
            top = tuple(tuple(rng.sample(range(vocab), 4)) for _ in out)
            n = len(out)
            records.append(
                RolloutRecord(
                    p,
                    s,
                    p,
                    prompt,
                    out,
                    (-2.0,) * n,
                    top,
                    ((-1.5, -2.0, -2.5, -3.0),) * n,
                    (1,) * n,
                    "stop",
                    "0",
                )
            )
    return records


def test_bf16_scores_stay_close_to_fp32_cpu(qwen3_checkpoint):
    records = make_records()
    cpu = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM).score(records)
    gpu_trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="auto", trainer_config=SYSTEM
    )
    assert gpu_trainer.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in gpu_trainer.model.parameters())
    assert all(m.dtype == torch.float32 and m.is_cuda for m in gpu_trainer.masters.parameters())
    gpu = gpu_trainer.score(records)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b.dense_logprobs, a.dense_logprobs, atol=0.15)
        np.testing.assert_allclose(b.acceptance, a.acceptance, atol=0.03)
        np.testing.assert_allclose(b.leftover_mass, a.leftover_mass, atol=1e-6)


def test_gpu_update_direction_sync_and_resume(qwen3_checkpoint, tmp_path):
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="auto", trainer_config=SYSTEM
    )
    records = make_records(seed=1)
    rewards = [1.0, 0.0, 0.0, 1.0]
    before = trainer.score(records)
    records = [
        dataclasses.replace(r, actor_logprobs=s.dense_logprobs) for r, s in zip(records, before)
    ]
    trainer.update(records, rewards, [s.dense_logprobs for s in before], 2)
    after = trainer.score(records)
    for i, reward in enumerate(rewards):
        assert (sum(after[i].dense_logprobs) > sum(before[i].dense_logprobs)) == (reward == 1.0)
    folder = trainer.save(tmp_path / "ckpt")
    engine_model = load_model(folder, dtype=torch.float32, device="cuda")
    ids = torch.tensor([4, 9, 200, 31], device="cuda")
    with torch.no_grad(), trainer.masters.swapped_in() as exact:
        want = exact(input_ids=ids[None]).logits[0].float()
        got = engine_model.compute_logits(
            engine_model(ids, torch.arange(4, device="cuda"), causal_attention([4]))
        )
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    resumed = PolicyTrainer.load(folder, ALGO, device="cuda", dtype="auto", trainer_config=SYSTEM)
    old = [s.dense_logprobs for s in after]
    m1 = trainer.update(records, rewards, old, 2)
    m2 = resumed.update(records, rewards, old, 2)
    assert m2["actor/loss"] == pytest.approx(m1["actor/loss"], rel=1e-4, abs=1e-6)
    a, b = trainer.state_dict_for_sync(), resumed.state_dict_for_sync()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    ma, mb = trainer.masters.parameters(), resumed.masters.parameters()
    assert max(float((x - y).abs().max()) for x, y in zip(ma, mb)) < 1e-6


def test_offload_keeps_masters_and_moments(qwen3_checkpoint):
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="auto", trainer_config=SYSTEM
    )
    records = make_records(seed=2)
    scores = trainer.score(records)
    trainer.update(records, [1.0, 0.0, 0.0, 1.0], [s.dense_logprobs for s in scores], 2)
    masters = [m.clone() for m in trainer.masters.parameters()]
    trainer.offload()
    assert not any(m.is_cuda for m in trainer.masters.parameters())
    assert not any(p.is_cuda for p in trainer.model.parameters())
    assert all(
        not v.is_cuda for s in trainer.optimizer.state.values() for v in s.values() if v.dim() > 0
    )
    trainer.onload()
    assert all(torch.equal(a, b) for a, b in zip(masters, trainer.masters.parameters()))
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    again = trainer.score(records)  # the model still runs after the round trip
    assert all(len(a.dense_logprobs) == len(r.output_ids) for a, r in zip(again, records))


def _host_allocations() -> int | None:
    """Page-locked blocks torch's host allocator has made (None where torch keeps no count)."""
    try:
        return int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))
    except (AttributeError, RuntimeError):
        return None


def test_offload_buffer_is_page_locked_once_and_reused(qwen3_checkpoint):
    system = dataclasses.replace(SYSTEM, offload_during_rollout=True)
    trainer = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="auto", trainer_config=system
    )
    stash = trainer._stash
    # reserved when the trainer was built: the first offload only copies
    assert stash.allocations == 1 and stash.buffer.is_pinned()
    pointer, size = stash.buffer.data_ptr(), stash.buffer.numel()
    records = make_records(seed=4)
    for cycle in range(3):
        scores = trainer.score(records)
        trainer.update(records, [1.0, 0.0, 0.0, 1.0], [s.dense_logprobs for s in scores], 2)
        trainer.free_gradients()
        masters = [m.clone() for m in trainer.masters.parameters()]
        state_bytes = sum(t.numel() * t.element_size() for t in trainer._offload_tensors())
        allocated, host_before = torch.cuda.memory_allocated(), _host_allocations()
        trainer.offload()
        assert all(stash.holds(t) and t.is_pinned() for t in trainer._offload_tensors())
        assert allocated - torch.cuda.memory_allocated() >= 0.9 * state_bytes, cycle
        trainer.onload()
        if host_before is not None:  # no pinned block made by the offload or the onload
            assert _host_allocations() == host_before, cycle
        assert stash.allocations == 1, cycle
        assert (stash.buffer.data_ptr(), stash.buffer.numel()) == (pointer, size)
        assert all(torch.equal(a, b) for a, b in zip(masters, trainer.masters.parameters()))
        assert all(p.is_cuda for p in trainer.model.parameters())
    assert trainer.offload_stats()["allocations"] == 1.0


def test_fused_norms_on_gpu_stay_close_to_fp32_cpu(qwen3_checkpoint):
    records = make_records(seed=3)
    cpu = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM).score(records)
    fused = PolicyTrainer(
        qwen3_checkpoint,
        ALGO,
        device="cuda",
        dtype="auto",
        trainer_config=dataclasses.replace(SYSTEM, fused_norms=True),
    )
    for a, b in zip(cpu, fused.score(records)):
        np.testing.assert_allclose(b.dense_logprobs, a.dense_logprobs, atol=0.15)
        np.testing.assert_allclose(b.acceptance, a.acceptance, atol=0.03)
