"""The offload's host buffer (sparrow/trainer/host_stash.py) and PolicyTrainer's round trip
through it on CPU: one buffer made once and reused at every offload, values back bit for bit.

    python -m pytest tests/trainer/test_host_stash.py -q
"""

from __future__ import annotations

import torch

from sparrow.trainer.host_stash import ALIGN, HostStash
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.test_policy_trainer import ALGO, SYSTEM, make_records, with_actor_logprobs


def mixed_tensors(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(7, 3, generator=gen),
        torch.randn(5, generator=gen).to(torch.bfloat16),
        torch.randint(0, 1000, (3, 2), generator=gen),
        torch.randn(1, generator=gen, dtype=torch.float64),
    ]


def test_copies_land_in_one_buffer_reused_across_calls():
    stash = HostStash(pin=False)
    first = mixed_tensors(0)
    views = stash.to_host(first)
    pointer = stash.buffer.data_ptr()
    assert stash.allocations == 1
    assert stash.buffer.numel() == HostStash.bytes_for(first) == 4 * ALIGN
    for tensor, view in zip(first, views):
        assert view.dtype == tensor.dtype and view.shape == tensor.shape
        assert torch.equal(view, tensor) and stash.holds(view)
        assert (view.data_ptr() - pointer) % ALIGN == 0
    for seed in (1, 2, 3):  # new values, same shapes: the same slots
        again = stash.to_host(mixed_tensors(seed))
        assert stash.allocations == 1 and stash.buffer.data_ptr() == pointer
        assert [v.data_ptr() for v in again] == [v.data_ptr() for v in views]
        assert all(torch.equal(v, t) for v, t in zip(again, mixed_tensors(seed)))
    # fewer bytes fit the buffer; more make a new one
    stash.to_host(mixed_tensors(4)[:2])
    assert stash.allocations == 1
    stash.to_host([torch.zeros(ALIGN + 1)])  # 2,052 bytes: five slots' worth
    assert stash.allocations == 2 and stash.buffer.numel() == 5 * ALIGN


def test_reserve_ahead_makes_the_first_copy_allocate_nothing():
    stash = HostStash(pin=False)
    stash.reserve(HostStash.bytes_for(mixed_tensors(0)) + ALIGN)
    stash.to_host(mixed_tensors(0))
    stash.to_host(mixed_tensors(1))
    assert stash.allocations == 1


def _state(trainer):
    masters = [m.clone() for m in trainer.masters.parameters()]
    params = [p.detach().clone() for p in trainer.model.parameters()]
    moments = [
        v.clone()
        for s in trainer.optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]
    return masters, params, moments


def test_policy_trainer_round_trips_through_one_buffer(qwen3_checkpoint):
    records = make_records(prompts=2, group=2, seed=5)
    plain = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="bfloat16", seed=0, trainer_config=SYSTEM
    )
    moved = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="bfloat16", seed=0, trainer_config=SYSTEM
    )
    scores = plain.score(records)
    update_records = with_actor_logprobs(records, scores, [0.0, 0.1, 0.2, 0.3])
    old = [s.dense_logprobs for s in scores]
    pointer = None
    for k, rewards in enumerate(([1.0, 0.0, 0.5, 0.2], [0.0, 1.0, 1.0, 0.3], [0.3, 0.9, 0.0, 1])):
        for trainer in (plain, moved):
            trainer.update(update_records, rewards, old, 2)
        before = _state(moved)
        moved._to_host()  # offload()'s move (a no-op off CUDA)
        stash = moved._stash
        tensors = moved._offload_tensors()
        assert moved.offloaded and all(stash.holds(t) for t in tensors)
        # masters, bf16 parameters, two moments per master, the buffers
        buffers = len(list(moved.model.buffers()))
        assert len(tensors) == 4 * len(moved.masters.parameters()) + buffers
        pointer = pointer or stash.buffer.data_ptr()
        assert stash.allocations == 1 and stash.buffer.data_ptr() == pointer, k
        assert all(torch.equal(a, b) for a, b in zip(_state(moved)[0], before[0]))
        moved.onload()
        assert not moved.offloaded and not any(stash.holds(t) for t in moved._offload_tensors())
        for got, want in zip(_state(moved), before):
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    for got, want in zip(_state(moved), _state(plain)):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert moved.offload_stats()["allocations"] == 1.0
