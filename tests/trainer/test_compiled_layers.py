"""compile_layers: every decoder layer of the trainer's model compiled in place, with the
eager model's numbers (the numeric test needs a GPU: a CPU compile takes about a minute).

    python -m pytest tests/trainer/test_compiled_layers.py -q          # CPU part
    python -m pytest tests/trainer/test_compiled_layers.py -q -m gpu   # on a GPU
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sparrow.config.schema import AlgoConfig, TrainerConfig
from sparrow.trainer.compiled_layers import compile_layers, decoder_layers, is_compiled
from sparrow.trainer.policy_trainer import PolicyTrainer, load_hf_model
from tests.trainer.test_policy_trainer_gpu import make_records

ALGO = AlgoConfig(lr=1e-3, grad_clip=1.0)
SYSTEM = TrainerConfig(micro_batch_tokens=64)


def test_every_layer_is_compiled_in_place_keeping_its_parameters(qwen3_checkpoint):
    model = load_hf_model(qwen3_checkpoint, torch.device("cpu"))
    before = {name: p for name, p in model.named_parameters()}
    assert not any(is_compiled(layer) for layer in decoder_layers(model))
    assert compile_layers(model) == model.config.num_hidden_layers
    assert all(is_compiled(layer) for layer in decoder_layers(model))
    # nothing replaced: the optimizer, master weights and checkpoints see the same tensors
    assert all(p is before[name] for name, p in model.named_parameters())


def test_the_trainer_compiles_only_when_asked(qwen3_checkpoint):
    plain = PolicyTrainer(qwen3_checkpoint, ALGO, device="cpu", trainer_config=SYSTEM)
    asked = PolicyTrainer(
        qwen3_checkpoint,
        ALGO,
        device="cpu",
        trainer_config=dataclasses.replace(SYSTEM, compile_layers=True),
    )
    assert not any(is_compiled(layer) for layer in decoder_layers(plain.model))
    assert all(is_compiled(layer) for layer in decoder_layers(asked.model))


def test_a_model_without_decoder_layers_is_refused():
    class NoLayers(torch.nn.Module):
        def get_decoder(self):
            return torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="no `layers`"):
        compile_layers(NoLayers())


def assert_no_further_from_fp32(reference, eager, compiled, field="dense_logprobs"):
    """Two bf16 computations of the same numbers differ by bf16 rounding (logprobs near -10
    by up to about 0.1): the compiled layers must be no further from the float32 model's
    numbers than twice the eager bf16 model's distance (a wrong fusion is far beyond that)."""

    def distance(scores):
        return max(
            float(np.max(np.abs(np.asarray(getattr(b, field)) - np.asarray(getattr(a, field)))))
            for a, b in zip(reference, scores)
        )

    eager_error, compiled_error = distance(eager), distance(compiled)
    assert compiled_error <= max(2 * eager_error, 0.02), (field, compiled_error, eager_error)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_score_and_update_like_eager_on_gpu(qwen3_checkpoint, checkpointing):
    system = dataclasses.replace(SYSTEM, gradient_checkpointing=checkpointing)
    reference = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="float32", trainer_config=system
    )
    eager = PolicyTrainer(
        qwen3_checkpoint, ALGO, device="cuda", dtype="auto", trainer_config=system
    )
    compiled = PolicyTrainer(
        qwen3_checkpoint,
        ALGO,
        device="cuda",
        dtype="auto",
        trainer_config=dataclasses.replace(system, compile_layers=True),
    )
    assert eager.dtype == compiled.dtype == torch.bfloat16

    def check(records):
        want, plain, got = (t.score(records) for t in (reference, eager, compiled))
        assert_no_further_from_fp32(want, plain, got, "dense_logprobs")
        assert_no_further_from_fp32(want, plain, got, "acceptance")

    records = make_records(seed=4)
    check(records)
    records = [
        dataclasses.replace(r, actor_logprobs=s.dense_logprobs)
        for r, s in zip(records, reference.score(records))
    ]
    rewards = [1.0, 0.0, 0.0, 1.0]
    old = [s.dense_logprobs for s in reference.score(records)]
    want = reference.update(records, rewards, old, group_size=2)
    plain = eager.update(records, rewards, old, group_size=2)
    got = compiled.update(records, rewards, old, group_size=2)
    # the same step: loss and gradient norm (before clipping) as close to float32's as eager's
    for key in ("actor/loss", "actor/grad_norm"):
        eager_error = abs(plain[key] - want[key])
        assert abs(got[key] - want[key]) <= max(2 * eager_error, 0.02 * abs(want[key]), 1e-4), (
            key,
            got[key],
            plain[key],
            want[key],
        )
    check(records)  # after the step
    # a second length compiles nothing new that fails, and scoring still agrees
    check(make_records(seed=9, prompts=3))
