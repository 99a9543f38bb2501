"""The fused elementwise kernels of the decoder layer (RMSNorm with the residual add, q/k
RMSNorm + RoPE, SiLU-mul) against float64 numpy loops and their PyTorch references; on CPU
in Triton's interpreter (`interpreted`), through the references without triton."""

import math

import numpy as np
import pytest
import torch

from sparrow.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_reference
from sparrow.kernels.rms_norm import rms_norm
from sparrow.kernels.runtime import KernelInputError
from sparrow.kernels.silu_mul import silu_mul
from sparrow.model.layers import Rotary


def numpy_rms(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def assert_bf16_close(got, want):
    """Within one bf16 step (the interpreter truncates where a GPU rounds to nearest)."""
    got, want = got.double(), torch.as_tensor(want, dtype=torch.float64)
    step = want.abs().clamp(min=1e-30) * 2**-7 + 1e-6
    assert torch.all((got - want).abs() <= 2 * step), float((got - want).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_residual_add(interpreted, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=gen).to(dtype)
    delta = torch.randn(5, 48, generator=gen).to(dtype)
    w = (1 + torch.randn(48, generator=gen) / 4).to(dtype)
    y = rms_norm(x, w, 1e-6)
    y2, summed = rms_norm(x, w, 1e-6, residual=delta)
    want_sum = x.double() + delta.double()
    if dtype == torch.float32:
        np.testing.assert_allclose(y.numpy(), numpy_rms(x, w, 1e-6), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(summed.numpy(), want_sum.numpy(), rtol=1e-6)
        np.testing.assert_allclose(y2.numpy(), numpy_rms(want_sum, w, 1e-6), rtol=1e-5, atol=1e-6)
    else:
        assert_bf16_close(summed, want_sum)
        assert_bf16_close(y, numpy_rms(x.float(), w.float(), 1e-6))
        assert_bf16_close(y2, numpy_rms(summed.float(), w.float(), 1e-6))
    assert y.dtype == dtype and y.shape == x.shape


def numpy_rope(x, positions, theta, w=None, eps=1e-6):
    x = np.asarray(x, np.float64)
    if w is not None:
        x = numpy_rms(x, w, eps)
    tokens, heads, dim = x.shape
    out = np.empty_like(x)
    for t in range(tokens):
        for i in range(dim // 2):
            angle = positions[t] * theta ** (-2 * i / dim)
            a, b = x[t, :, i], x[t, :, i + dim // 2]
            out[t, :, i] = a * math.cos(angle) - b * math.sin(angle)
            out[t, :, i + dim // 2] = b * math.cos(angle) + a * math.sin(angle)
    return out


@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_equals_a_plain_loop(interpreted, norm):
    gen = torch.Generator().manual_seed(1)
    tokens, hq, hkv, dim = 4, 6, 2, 16
    q = torch.randn(tokens, hq, dim, generator=gen)
    k = torch.randn(tokens, hkv, dim, generator=gen)
    qw = 1 + torch.randn(dim, generator=gen) / 4 if norm else None
    kw = 1 + torch.randn(dim, generator=gen) / 4 if norm else None
    positions = torch.tensor([0, 3, 17, 250])
    cos, sin = Rotary(dim, 10000.0, None).cos_sin(positions, torch.float32)
    got_q, got_k = qk_norm_rope(q, k, cos, sin, qw, kw, 1e-6)
    np.testing.assert_allclose(
        got_q.numpy(), numpy_rope(q, positions.tolist(), 1e4, qw), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        got_k.numpy(), numpy_rope(k, positions.tolist(), 1e4, kw), rtol=1e-4, atol=1e-5
    )


def test_qk_norm_rope_bf16_matches_the_reference(interpreted):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 4, 32, generator=gen).bfloat16()
    k = torch.randn(3, 2, 32, generator=gen).bfloat16()
    qw, kw = (1 + torch.randn(32, generator=gen) / 4).bfloat16(), torch.ones(32).bfloat16()
    cos, sin = Rotary(32, 1e6, None).cos_sin(torch.tensor([5, 900, 4000]), torch.bfloat16)
    got = qk_norm_rope(q, k, cos, sin, qw, kw, 1e-6)
    want = qk_norm_rope_reference(q, k, cos, sin, qw, kw, 1e-6)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        # each of four roundings may land one bf16 step off in the interpreter
        assert (g.float() - w.float()).abs().max() <= 0.03 * w.float().abs().max()
        assert (g.float() - w.float()).abs().mean() <= 0.02 * w.float().abs().mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(interpreted, dtype):
    gen = torch.Generator().manual_seed(3)
    gate = (torch.randn(3, 2500, generator=gen) * 4).to(dtype)
    up = torch.randn(3, 2500, generator=gen).to(dtype)
    got = silu_mul(gate, up, block=1024)
    g = gate.double().numpy()
    want = g / (1 + np.exp(-g)) * up.double().numpy()
    if dtype == torch.float32:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    else:
        assert_bf16_close(got, want)


def test_fused_launchers_check_inputs():
    with pytest.raises(KernelInputError, match="weight must be"):
        rms_norm(torch.zeros(2, 8), torch.ones(4), 1e-6)
    with pytest.raises(KernelInputError, match="residual must"):
        rms_norm(torch.zeros(2, 8), torch.ones(8), 1e-6, residual=torch.zeros(3, 8))
    with pytest.raises(KernelInputError, match="cos must be"):
        qk_norm_rope(
            torch.zeros(2, 4, 8),
            torch.zeros(2, 2, 8),
            torch.zeros(2, 8),
            torch.zeros(2, 1, 8),
            None,
            None,
            1e-6,
        )
    with pytest.raises(KernelInputError, match="gate and up"):
        silu_mul(torch.zeros(2, 8), torch.zeros(2, 9))


def test_autograd_keeps_the_pytorch_path(interpreted):
    w = torch.ones(8, requires_grad=True)
    x = torch.randn(2, 8)
    rms_norm(x, w, 1e-6).sum().backward()
    assert w.grad is not None and w.grad.shape == (8,)
