"""The decoder's residual stream (each sublayer's add left pending for the next norm's kernel,
model/stream.py) against the adds done one by one with the same modules: norm, attention, add,
norm, MLP, add per layer, then the final norm. (On CPU no projection kernel does the add; the
GPU form, with the adds in the skinny linear kernel, is tested in tests/kernels.)

    python -m pytest tests/model/test_residual_adds.py -q
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from sparrow.model import causal_attention, load_model
from sparrow.model.stream import Stream

LENGTHS = [10, 7]


def _inputs(model):
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(0, model.arch.vocab_size, (sum(LENGTHS),), generator=generator)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])
    return ids, positions


def _output(stream, residual):
    """A sublayer's own output: the add it left pending on the residual it was given."""
    assert stream.x is residual and stream.sumsq is None
    return stream.delta


def _adds_one_by_one(model, ids, positions, attention):
    x = model.model.embed_tokens(ids)
    cos, sin = model.rotary.cos_sin(positions, x.dtype)
    for layer in model.model.layers:
        x = x + _output(
            layer.self_attn(layer.input_layernorm(x), cos, sin, attention, residual=x), x
        )
        x = x + _output(layer.mlp(layer.post_attention_layernorm(x), residual=x), x)
    return model.model.norm(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("autograd", [False, True], ids=["no_grad", "autograd"])
def test_forward_equals_adds_one_by_one_bitwise(any_checkpoint, dtype, autograd):
    model = load_model(any_checkpoint, dtype=dtype)
    model.requires_grad_(autograd)
    ids, positions = _inputs(model)
    attention = causal_attention(LENGTHS)
    with contextlib.nullcontext() if autograd else torch.no_grad():
        ours = model(ids, positions, attention)
        expected = _adds_one_by_one(model, ids, positions, attention)
    assert ours.requires_grad == autograd
    assert ours.dtype == expected.dtype == dtype
    assert torch.equal(ours, expected)
    if autograd:  # the gradients through the pending adds are the plain ones, bit for bit
        ours.float().pow(2).sum().backward()
        ours_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        expected.float().pow(2).sum().backward()
        expected_grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(ours_grads) == len(expected_grads) > 0
        assert all(torch.equal(a, b) for a, b in zip(ours_grads, expected_grads))


def test_layer_returns_its_mlp_output_pending(qwen3_checkpoint):
    model = load_model(qwen3_checkpoint)
    ids, positions = _inputs(model)
    attention = causal_attention(LENGTHS)
    layer = model.model.layers[0]
    with torch.no_grad():
        x = model.model.embed_tokens(ids)
        cos, sin = model.rotary.cos_sin(positions, x.dtype)
        stream = layer(Stream(x), cos, sin, attention)
        residual, delta = stream.x, stream.delta
        after_attention = x + _output(
            layer.self_attn(layer.input_layernorm(x), cos, sin, attention, residual=x), x
        )
        mlp_out = _output(
            layer.mlp(layer.post_attention_layernorm(after_attention), residual=after_attention),
            after_attention,
        )
    # the attention's add is done, the MLP's is not: the caller's next norm adds delta
    assert torch.equal(residual, after_attention)
    assert torch.equal(delta, mlp_out)
    assert delta.abs().max() > 0.1
