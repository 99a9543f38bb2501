"""fuse_rms_norms: every transformers RMSNorm runs torch.rms_norm, with the same results.

python -m pytest tests/trainer/test_fused_norms.py -q
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.trainer.fused_norms import fuse_rms_norms, is_rms_norm
from sparrow.trainer.policy_trainer import PolicyTrainer, load_hf_model
from tests.trainer.test_policy_trainer import make_records, rollout_step

ALGO = AlgoConfig(lr=1e-3, grad_clip=0.0, tis_cap=2.0)
SYSTEM = TrainerConfig(micro_batch_tokens=10_000)


def test_every_norm_is_fused_and_the_forward_stays(qwen3_checkpoint):
    model = load_hf_model(qwen3_checkpoint, torch.device("cpu"))
    layers = model.config.num_hidden_layers
    ids = torch.tensor([[5, 17, 200, 3, 99, 42]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    # two norms around attention and MLP, q and k norms per layer, and the final norm
    assert fuse_rms_norms(model) == 4 * layers + 1
    assert sum(is_rms_norm(m) for m in model.modules()) == 4 * layers + 1
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trainer_with_fused_norms_scores_and_updates_alike(qwen3_checkpoint, dtype):
    """fp32: the same numbers. bf16: both roundings stay as close to fp32 (the bound the GPU
    test holds bf16 scoring to) and move the weights the same way."""
    records = make_records(seed=5)
    rewards = [0, 1, 0, 1, 1, 0]
    exact = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype="float32", trainer_config=SYSTEM
    ).score(records)
    plain = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cpu", dtype=dtype, seed=2, trainer_config=SYSTEM
    )
    fused = PolicyTrainer(
        qwen3_checkpoint,
        ALGO,
        device="cpu",
        dtype=dtype,
        seed=2,
        trainer_config=dataclasses.replace(SYSTEM, fused_norms=True),
    )
    tolerance = 1e-5 if dtype == "float32" else 0.15
    for want, a, b in zip(exact, plain.score(records), fused.score(records)):
        np.testing.assert_allclose(a.dense_logprobs, want.dense_logprobs, atol=tolerance)
        np.testing.assert_allclose(b.dense_logprobs, want.dense_logprobs, atol=tolerance)
    m_plain = rollout_step(plain, records, rewards, 3)
    m_fused = rollout_step(fused, records, rewards, 3)
    assert m_fused["actor/loss"] == pytest.approx(m_plain["actor/loss"], abs=tolerance)
    # the fused backward reaches every weight as transformers' does
    assert m_fused["actor/grad_norm"] == pytest.approx(m_plain["actor/grad_norm"], rel=0.1)
