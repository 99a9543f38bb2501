"""The skinny decode linear kernel (kernels/linear.py) against float64 products: plain, with
bias, with the SwiGLU gate read in, every way of cutting the work (column tiles, K splits
summed by the last program to arrive, either tile orientation); its fallbacks and checks.
On CPU in Triton's interpreter (`interpreted`); the model shapes and CUDA-graph replays are
marked gpu."""

import pytest
import torch
from torch.nn import functional as F

from sparrow_core.kernels.linear import LinearLaunch, default_launch, skinny_linear
from sparrow_core.kernels.runtime import KernelInputError
from sparrow_core.kernels.silu_mul import silu_mul

LAUNCHES = [LinearLaunch(block_n=16, block_k=64, split=1, w_major=True),
            LinearLaunch(block_n=32, block_k=64, split=2, w_major=False),
            LinearLaunch(block_n=16, block_k=32, split=4, w_major=True, num_stages=2)]


def operands(rows, n_out, k_len, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_len, generator=gen).to(dtype).to(device)
    w = (torch.randn(n_out, k_len, generator=gen) / k_len ** 0.5).to(dtype).to(device)
    b = torch.randn(n_out, generator=gen).to(dtype).to(device)
    return x, w, b


def assert_rounded_product(got, x, w, b=None):
    """got equals the float64 product to the output's rounding (one step of its dtype, plus
    float32 summation noise), and is in x's dtype."""
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    step = 2.0 ** -7 if x.dtype == torch.bfloat16 else 2.0 ** -10
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.double() - want).abs()
    assert torch.all(err <= want.abs() * step + 1e-4), float(err.max())


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_product_equals_float64(interpreted, launch, rows):
    x, w, b = operands(rows, 48, 256, torch.bfloat16, seed=rows)
    assert_rounded_product(skinny_linear(x, w, launch=launch), x, w)
    assert_rounded_product(skinny_linear(x, w, b, launch=launch), x, w, b)


def test_float16(interpreted):
    x, w, b = operands(9, 40, 128, torch.float16)
    assert_rounded_product(skinny_linear(x, w, b, launch=LAUNCHES[1]), x, w, b)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_gated_equals_silu_mul_then_product(interpreted, launch):
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(7, 2 * 128, generator=gen).bfloat16()
    w = (torch.randn(24, 128, generator=gen) / 12).bfloat16()
    got = skinny_linear(gate_up, w, launch=launch, gated=True)
    # the gate as the silu_mul kernel rounds it, then the product
    hidden = silu_mul(*gate_up.split(128, dim=-1))
    assert_rounded_product(got, hidden, w)
    # a wrong pairing (up first) would be far off
    swapped = silu_mul(*gate_up.split(128, dim=-1)[::-1])
    assert (got.double() - (swapped.double() @ w.double().T)).abs().max() > 0.1


def test_split_counters_reset_between_calls(interpreted):
    """The last program of each column block sets its arrival counter back to zero: a second
    call (a different x) sums its own partials, not the first call's."""
    x, w, _ = operands(4, 64, 256, torch.bfloat16)
    launch = LinearLaunch(block_n=16, block_k=32, split=8)
    first = skinny_linear(x, w, launch=launch)
    second = skinny_linear(-x, w, launch=launch)
    assert_rounded_product(first, x, w)
    assert torch.equal(second, -first)


def test_shapes_it_does_not_take_run_the_reference(interpreted):
    x, w, b = operands(17, 16, 64, torch.bfloat16)  # more rows than MAX_ROWS
    assert torch.equal(skinny_linear(x, w, b), F.linear(x, w, b))
    x32, w32, b32 = operands(4, 16, 64, torch.float32)
    assert torch.equal(skinny_linear(x32, w32, b32), F.linear(x32, w32, b32))
    gate_up = torch.randn(3, 32)
    w_down = torch.randn(5, 16)
    assert torch.equal(skinny_linear(gate_up, w_down, gated=True),
                       F.linear(silu_mul(gate_up[:, :16], gate_up[:, 16:]), w_down))


def test_autograd_takes_the_reference(interpreted):
    x, w, _ = operands(4, 16, 64, torch.bfloat16)
    w.requires_grad_()
    skinny_linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0).expand(16, -1))


def test_checks_name_the_operand():
    x, w, b = operands(4, 16, 64, torch.bfloat16)
    with pytest.raises(KernelInputError, match="weight must be"):
        skinny_linear(x, w[:, :32])
    with pytest.raises(KernelInputError, match="bias must be"):
        skinny_linear(x, w, b[:3])
    with pytest.raises(KernelInputError, match="gate and up"):
        skinny_linear(x, w, gated=True)


def test_default_launch_covers_every_sm():
    for rows, n_out, k_len in ((16, 4096, 2048), (16, 2048, 2048), (16, 12288, 2048),
                               (16, 2048, 6144), (16, 151936, 2048), (8, 2560, 9728)):
        launch = default_launch(rows, n_out, k_len, 132)
        programs = -(-n_out // launch.block_n) * launch.split
        assert programs >= 128 and k_len % (launch.block_k * launch.split) == 0


gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("rows", [1, 16, 64])  # 64: past MAX_ROWS, the reference
@pytest.mark.parametrize("n_out,k_len", [(4096, 2048), (2048, 2048), (12288, 2048),
                                         (2048, 6144), (151936, 2048), (2560, 9728)])
def test_model_shapes_on_gpu(rows, n_out, k_len):
    x, w, _ = operands(rows, n_out, k_len, torch.bfloat16, device="cuda")
    got = skinny_linear(x, w)
    want = F.linear(x.float(), w.float())
    err = (got.float() - want).abs()
    assert torch.all(err <= want.abs() * 2 ** -7 + 1e-3), float(err.max())
    gated = skinny_linear(torch.cat([x, x.flip(0)], dim=1), w, gated=True)
    hidden = silu_mul(x, x.flip(0))
    torch.testing.assert_close(gated.float(), F.linear(hidden.float(), w.float()),
                               atol=1e-3, rtol=2 ** -7)


@gpu
def test_split_launch_replays_in_a_cuda_graph():
    x, w, b = operands(16, 2048, 6144, torch.bfloat16, device="cuda")
    eager = skinny_linear(x, w, b)  # also allocates the arrival counters before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = skinny_linear(x, w, b)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
