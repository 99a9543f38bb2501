"""The paper table's 4B and 8B shapes at reduced depth (2 layers, the real width and
vocabulary) on 2 NCCL ranks, as benchmarks/paper_table.py's trainer group runs them: the
offload's page-locked buffer made when the trainer is built and reused by every round trip,
the GPU memory freed, the updates going on, the sync's packed weights the model's size.

    python -m pytest -m multigpu tests/benchmarks/test_paper_table_gpu.py -q   # 2 GPUs, ~2 min
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import paper_table  # noqa: E402

from sparrow.config.schema import AlgoConfig, TrainerConfig  # noqa: E402
from sparrow.data.rollouts import RolloutRecord  # noqa: E402
from tests.benchmarks.paper_table_workers import shape_rank  # noqa: E402
from tests.trainer.sharded_workers import free_port  # noqa: E402

pytestmark = [
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]


def records(prompts: int = 2, samples: int = 8, new_tokens: int = 64) -> list[RolloutRecord]:
    rng = np.random.default_rng(0)
    out = []
    for p in range(prompts):
        prompt = tuple(int(t) for t in rng.integers(0, 150_000, 32))
        for s in range(samples):
            ids = tuple(int(t) for t in rng.integers(0, 150_000, new_tokens))
            top = np.stack([rng.choice(150_000, 4, replace=False) for _ in ids]).astype(np.int32)
            top[:, 0] = ids
            top_logprobs = np.tile(np.float32([-2.0, -2.5, -3.0, -3.5]), (new_tokens, 1))
            out.append(
                RolloutRecord(
                    p,
                    s,
                    p,
                    prompt,
                    ids,
                    (-2.0,) * new_tokens,
                    top,
                    top_logprobs,
                    (1,) * new_tokens,
                    "length",
                    "0",
                )
            )
    return out


@pytest.mark.parametrize("size", ["4b", "8b"])
def test_paper_shape_group_path_at_two_layers(size, tmp_path):
    from sparrow.model.random_checkpoint import make_random_checkpoint

    shape = dict(paper_table.SHAPES[size], num_layers=2)
    make_random_checkpoint(tmp_path / "model", "qwen3", seed=0, **shape)
    algo = AlgoConfig(lr=1e-6)
    system = TrainerConfig(
        micro_batch_tokens=4096, gradient_checkpointing=True, offload_during_rollout=True
    )
    batch = records()
    rewards = [float(i % 2) for i in range(len(batch))]
    old = [r.actor_logprobs for r in batch]
    mp.spawn(
        shape_rank,
        args=(2, free_port(), str(tmp_path / "model"), algo, system, batch, rewards, old, tmp_path),
        nprocs=2,
        join=True,
    )
    got = torch.load(tmp_path / "shape_rank0.pt", weights_only=False)
    assert got["reserved"]["allocations"] == 1.0  # page-locked when the trainer was built
    assert [c["allocations"] for c in got["cycles"]] == [1.0, 1.0]
    h, q, kv, d, i = (
        shape[k]
        for k in ("hidden_size", "num_q_heads", "num_kv_heads", "head_dim", "intermediate_size")
    )
    layer = h * q * d * 2 + h * kv * d * 2 + 3 * h * i + 2 * h + 2 * d
    embeddings = shape["vocab_size"] * h * (1 if shape["tie_word_embeddings"] else 2)
    params = 2 * layer + embeddings + h
    # per rank half of each parameter's fp32 weight and two moments: 6 of its 12 bytes
    for cycle in got["cycles"]:
        assert cycle["freed"] >= 0.9 * 6 * params, cycle
        assert cycle["bytes"] >= 6 * params
    assert got["packed_bytes"] == 2 * params
    assert all(torch.isfinite(torch.tensor(got["losses"])))
    assert got["scored"] == [64] * 16
