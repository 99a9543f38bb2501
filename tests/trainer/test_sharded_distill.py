"""DistillSparse's LoRA step on 2 gloo ranks (ShardedDistiller over ShardedPolicyTrainer's
shards) equals one process's SparseDistiller on the same batch: LoRA weights and metrics after
one step, and after a second one resumed from the folder rank 0 saved.

    python -m pytest tests/trainer/test_sharded_distill.py -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparrow.config.schema import AlgoConfig, DistillConfig, TrainerConfig
from sparrow.model.builtin import resolve_model_path
from sparrow.model.loader import SafetensorsCheckpoint
from sparrow.sparse import get_preset
from sparrow.trainer.distill import SparseDistiller
from sparrow.trainer.lora import adapter_state
from tests.trainer.distill_fixtures import sparse_rollouts
from tests.trainer.sharded_workers import distill_rank, run_ranks

SCHEDULE = get_preset("tiny-0.80")
# several micro-batches per rank, and a clip that is active (the global norm matters)
ALGO = AlgoConfig(
    lr=1e-6,
    grad_clip=1e-3,
    distill=DistillConfig(enabled=True, lora_rank=4, lora_alpha=8, lr_scale=1000.0, loss="full_kl"),
)
SYSTEM = TrainerConfig(micro_batch_tokens=64)


def close_metrics(have: dict, want: dict) -> None:
    assert set(have) == set(want)
    for key, value in want.items():
        assert have[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def close_lora(have: dict, want: dict) -> None:
    assert set(have) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(have[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_two_ranks_distill_like_one_process_and_resume(tmp_path):
    torch.set_num_threads(1)
    path = resolve_model_path("builtin:tiny")
    # three prompts: one rank takes two, the other one
    records = sparse_rollouts(path, SCHEDULE, prompts=3, samples=2, new_tokens=24)
    single = SparseDistiller(path, ALGO, "cpu", "float32", seed=0, trainer_config=SYSTEM)
    single.set_base(SafetensorsCheckpoint(path))
    before = {k: v.clone() for k, v in adapter_state(single.model).items()}
    run_ranks(2, path, ALGO, SYSTEM, records, SCHEDULE, tmp_path, body=distill_rank)
    got = torch.load(tmp_path / "distill0.pt", weights_only=False)

    first = single.distill(records, SCHEDULE)
    assert first["distill/grad_norm"] > ALGO.grad_clip
    close_metrics(got["first"], first)
    after_first = {k: v.clone() for k, v in adapter_state(single.model).items()}
    ranks = [torch.load(tmp_path / f"lora{r}.pt") for r in range(2)]
    for name in after_first:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # replicated, bit for bit
    close_lora(ranks[0], after_first)
    assert any(not torch.equal(before[k], after_first[k]) for k in before)

    # the second step of a distiller loaded from the group's folder: moments and update count
    second = single.distill(records, SCHEDULE)
    close_metrics(got["second"], second)
    assert second["distill/updates"] == 2
    close_lora(got["lora"], adapter_state(single.model))
    assert set(got["bin_stats"]) == set(single.bin_stats) == {"lora", "base"}
    for which, stats in single.bin_stats.items():
        for have, want in zip(got["bin_stats"][which], stats, strict=True):
            have, want = dataclasses.asdict(have), dataclasses.asdict(want)
            assert have["n"] == want["n"] > 0
            for key in ("mean", "p1", "p5", "p10", "p50", "min"):
                assert have[key] == pytest.approx(want[key], rel=1e-5), (which, key)
    # the folder is the single-process one: one process resumes from it too
    resumed = SparseDistiller.load(
        tmp_path / "distill", path, ALGO, "cpu", "float32", trainer_config=SYSTEM
    )
    close_lora(adapter_state(resumed.model), after_first)
