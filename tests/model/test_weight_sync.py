"""Decoder.load_hf_state_dict: syncing weights from a transformers model by name."""

from __future__ import annotations

import pytest
import torch

from sparrow.model import WeightLoadError, causal_attention, load_model
from sparrow.model.random_checkpoint import randomize_weights


def _other_hf_model(path, seed):
    """A transformers model of the checkpoint's shape with other random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize_weights(model, seed)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model.compute_logits(
            model(ids, torch.arange(len(ids)), causal_attention([len(ids)]))
        )


@pytest.mark.parametrize("fixture", ["qwen3_checkpoint", "llama_checkpoint"])
def test_synced_weights_give_the_other_models_logits(request, fixture):
    path = request.getfixturevalue(fixture)
    model = load_model(path)
    other = _other_hf_model(path, seed=42)
    ids = torch.randint(0, model.arch.vocab_size, (13,), generator=torch.Generator().manual_seed(1))
    before = _logits(model, ids)
    # transformers' state_dict repeats lm_head.weight for a tied model; it must be accepted
    model.load_hf_state_dict(other.state_dict())
    with torch.no_grad():
        theirs = other(ids[None]).logits[0]
    after = _logits(model, ids)
    torch.testing.assert_close(after, theirs, atol=1e-4, rtol=0)
    assert (after - before).abs().max() > 0.1


def test_sync_converts_dtype_in_place(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint, dtype=torch.bfloat16)
    weight = model.model.layers[0].mlp.up_proj.weight
    other = _other_hf_model(qwen3_checkpoint, seed=5).state_dict()
    model.load_hf_state_dict(other)
    assert model.model.layers[0].mlp.up_proj.weight is weight
    assert weight.dtype == torch.bfloat16
    expected = other["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16)
    assert torch.equal(weight, expected)


def test_wrong_shape_is_named_and_nothing_is_copied(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    state = _other_hf_model(qwen3_checkpoint, seed=6).state_dict()
    state["model.layers.1.self_attn.v_proj.weight"] = torch.zeros(31, 64)
    with pytest.raises(WeightLoadError, match=r"v_proj.weight.*\(31, 64\).*\(32, 64\)"):
        model.load_hf_state_dict(state)
    for name, value in model.state_dict().items():
        assert torch.equal(value, snapshot[name]), name


def test_missing_key_is_an_error_unless_not_strict(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    state = _other_hf_model(qwen3_checkpoint, seed=7).state_dict()
    del state["model.norm.weight"]
    with pytest.raises(WeightLoadError, match="model.norm.weight"):
        model.load_hf_state_dict(state)
    partial = {"model.norm.weight": torch.full((64,), 3.0)}
    model.load_hf_state_dict(partial, strict=False)
    assert torch.equal(model.model.norm.weight, partial["model.norm.weight"])


def test_unexpected_key_is_an_error(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    with pytest.raises(WeightLoadError, match="model.layers.9.mlp.up_proj.weight"):
        model.load_hf_state_dict(
            {"model.layers.9.mlp.up_proj.weight": torch.zeros(1)}, strict=False
        )


def test_untied_model_needs_its_lm_head(llama_checkpoint):
    model = load_model(llama_checkpoint)
    state = _other_hf_model(llama_checkpoint, seed=8).state_dict()
    del state["lm_head.weight"]
    with pytest.raises(WeightLoadError, match="lm_head.weight"):
        model.load_hf_state_dict(state)
