"""The update's importance weights on stale sparse samples: w = min(p_dense / q_behavior, C)
per token, with q_behavior the actor logprobs recorded at sampling (an older version's sparse
engine) and p_dense the step's dense policy, held to a plain loop over tokens. The ratio's
anchor stays the step's dense policy, so a first pass has ratio 1 whatever the staleness
(the decoupled form of PPO: docs/async.md).

    python -m pytest tests/trainer/test_stale_corrections.py -q
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.trainer.policy_trainer import PolicyTrainer
from tests.trainer.test_policy_trainer import make_records

ALGO = AlgoConfig(lr=1e-3, grad_clip=0.0, tis_cap=1.5)
SYSTEM = TrainerConfig(micro_batch_tokens=10_000)


def test_tis_weights_use_the_recorded_behavior_logprobs(qwen3_checkpoint):
    trainer = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    records = make_records(prompts=2, group=3, seed=5)
    scores = trainer.score(records)
    # as sampled by an older sparse engine: its logprobs sit off the step's dense ones by
    # per-token amounts on both sides of 0, some past the cap
    shifts = [
        [0.7 * math.sin(3 * i + t) for t in range(len(r.output_ids))] for i, r in enumerate(records)
    ]
    records = [
        dataclasses.replace(
            r,
            actor_logprobs=tuple(d + x for d, x in zip(s.dense_logprobs, shift)),
            policy_version=i % 2,
        )
        for i, (r, s, shift) in enumerate(zip(records, scores, shifts))
    ]
    old = [s.dense_logprobs for s in scores]
    metrics = trainer.update(records, [0.0, 0.5, 1.0, 0.2, 0.9, 0.4], old, 3)
    weights, truncated, k3 = [], 0, []
    for r, dense in zip(records, old):
        for d, a in zip(dense, r.actor_logprobs):
            rho = math.exp(d - a)
            weights.append(min(rho, ALGO.tis_cap))
            truncated += rho >= ALGO.tis_cap
            k3.append((rho - 1) - math.log(rho))
    assert metrics["actor/tis_weight_mean"] == pytest.approx(sum(weights) / len(weights), rel=1e-5)
    assert metrics["actor/tis_truncated_frac"] == pytest.approx(truncated / len(weights))
    assert metrics["actor/mismatch_kl"] == pytest.approx(sum(k3) / len(k3), rel=1e-4)
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert 0 < truncated < len(weights)  # the cap is active on some tokens, not all
