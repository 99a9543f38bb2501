"""make_random_checkpoint: seeding, scale, sharding, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sparrow.model import ModelConfigError, causal_attention, load_model, read_arch
from sparrow.model.random_checkpoint import make_random_checkpoint


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, qwen3_checkpoint):
    again = load_file(str(make_random_checkpoint(tmp_path / "a", seed=0) / "model.safetensors"))
    other = load_file(str(make_random_checkpoint(tmp_path / "b", seed=1) / "model.safetensors"))
    fixture = load_file(str(qwen3_checkpoint / "model.safetensors"))
    assert all(torch.equal(again[k], fixture[k]) for k in fixture)
    assert not torch.equal(other["model.embed_tokens.weight"], fixture["model.embed_tokens.weight"])


def test_weights_are_scaled_for_order_one_logits(qwen3_checkpoint):
    tensors = load_file(str(qwen3_checkpoint / "model.safetensors"))
    down = tensors["model.layers.0.mlp.down_proj.weight"]  # fan-in 128
    assert down.std().item() == pytest.approx(128**-0.5, rel=0.1)
    norm = tensors["model.layers.0.input_layernorm.weight"]
    assert 0.1 < norm.std().item() < 0.3 and norm.mean().item() == pytest.approx(1.0, abs=0.1)
    model = load_model(qwen3_checkpoint)
    with torch.no_grad():
        logits = model.compute_logits(
            model(torch.arange(20), torch.arange(20), causal_attention([20]))
        )
    assert 1.0 < logits.std().item() < 4.0


def test_config_records_the_requested_shape(tmp_path):
    path = make_random_checkpoint(
        tmp_path / "m",
        "qwen2",
        vocab_size=300,
        hidden_size=48,
        num_layers=3,
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=12,
        intermediate_size=40,
        tie_word_embeddings=False,
    )
    arch = read_arch(path)
    assert (arch.family, arch.vocab_size, arch.num_layers, arch.intermediate_size) == (
        "qwen2",
        300,
        3,
        40,
    )
    assert (arch.num_q_heads, arch.num_kv_heads, arch.head_dim) == (4, 1, 12)
    assert arch.qkv_bias and not arch.tie_word_embeddings
    assert json.loads((path / "config.json").read_text())["bos_token_id"] == 257


@pytest.mark.parametrize(
    "kwargs,named",
    [({"family": "gpt2"}, "gpt2"), ({"vocab_size": 200}, "vocab_size"), ({"shards": 0}, "shards")],
)
def test_refusals(tmp_path, kwargs, named):
    with pytest.raises(ModelConfigError, match=named):
        make_random_checkpoint(tmp_path / "x", **kwargs)
