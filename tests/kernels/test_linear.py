"""The skinny decode linear kernel (kernels/linear.py) against float64 products: plain, with
bias, with the SwiGLU gate read in, every way of cutting the work (column tiles, K splits
summed by the last program to arrive, either tile orientation); its fallbacks and checks.
On CPU in Triton's interpreter (`interpreted`); the model shapes and CUDA-graph replays are
marked gpu."""

import pytest
import torch
from torch.nn import functional as F

from sparrow.kernels.linear import LinearLaunch, default_launch, skinny_linear
from sparrow.kernels.runtime import KernelInputError
from sparrow.kernels.silu_mul import silu_mul

LAUNCHES = [
    LinearLaunch(block_n=16, block_k=64, split=1, w_major=True),
    LinearLaunch(block_n=32, block_k=64, split=2, w_major=False),
    LinearLaunch(block_n=16, block_k=32, split=4, w_major=True, num_stages=2),
]


def operands(rows, n_out, k_len, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_len, generator=gen).to(dtype).to(device)
    w = (torch.randn(n_out, k_len, generator=gen) / k_len**0.5).to(dtype).to(device)
    b = torch.randn(n_out, generator=gen).to(dtype).to(device)
    return x, w, b


def assert_rounded_product(got, x, w, b=None):
    """got equals the float64 product to the output's rounding (one step of its dtype, plus
    float32 summation noise), and is in x's dtype."""
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    step = 2.0**-7 if x.dtype == torch.bfloat16 else 2.0**-10
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
    assert torch.equal(
        skinny_linear(gate_up, w_down, gated=True),
        F.linear(silu_mul(gate_up[:, :16], gate_up[:, 16:]), w_down),
    )


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
    for rows, n_out, k_len in (
        (16, 4096, 2048),
        (16, 2048, 2048),
        (16, 12288, 2048),
        (16, 2048, 6144),
        (16, 151936, 2048),
        (8, 2560, 9728),
    ):
        launch = default_launch(rows, n_out, k_len, 132)
        programs = -(-n_out // launch.block_n) * launch.split
        assert programs >= 128 and k_len % (launch.block_k * launch.split) == 0


def test_prefetch_lines_cover_the_asked_columns():
    from sparrow.kernels.linear_launch import prefetch_lines

    assert prefetch_lines(LinearLaunch(split=1), 2048) == 32  # the whole row: 2048 / 64
    assert prefetch_lines(LinearLaunch(split=4), 6144) == 32  # 1536 columns, rounded up
    assert prefetch_lines(LinearLaunch(prefetch_k=256), 2048) == 4
    assert prefetch_lines(LinearLaunch(prefetch_k=100), 2048) == 2
    assert prefetch_lines(LinearLaunch(split=1), 9728) == 64  # at most 64


gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("rows", [1, 16, 64])  # 64: past MAX_ROWS, the reference
@pytest.mark.parametrize(
    "n_out,k_len",
    [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144), (151936, 2048), (2560, 9728)],
)
def test_model_shapes_on_gpu(rows, n_out, k_len):
    x, w, _ = operands(rows, n_out, k_len, torch.bfloat16, device="cuda")
    got = skinny_linear(x, w)
    want = F.linear(x.float(), w.float())
    err = (got.float() - want).abs()
    assert torch.all(err <= want.abs() * 2**-7 + 1e-3), float(err.max())
    gated = skinny_linear(torch.cat([x, x.flip(0)], dim=1), w, gated=True)
    hidden = silu_mul(x, x.flip(0))
    torch.testing.assert_close(
        gated.float(), F.linear(hidden.float(), w.float()), atol=1e-3, rtol=2**-7
    )


@gpu
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize(
    "n_out,k_len,gated", [(2048, 2048, False), (2048, 6144, True), (2560, 9728, True)]
)
def test_residual_and_norm_fold_on_gpu(rows, n_out, k_len, gated):
    """Model shapes (o_proj; down_proj split over K, gated; then q/k/v and gate/up reading
    the sum through its norm): the residual sum is bit for bit residual + the plain call's
    output; the sums of squares are the sum's; the folded norm equals the rms_norm kernel
    then the product, to the roundings of the normalised x."""
    from sparrow.kernels.linear import RowNorm
    from sparrow.kernels.rms_norm import rms_norm

    width = 2 * k_len if gated else k_len
    a, w, _ = operands(rows, n_out, width, torch.bfloat16, device="cuda")
    w = w[:, :k_len].contiguous()
    residual = torch.randn(rows, n_out, device="cuda").bfloat16() * 3
    summed, sumsq = skinny_linear(a, w, residual=residual, gated=gated)
    assert torch.equal(summed, residual + skinny_linear(a, w, gated=gated))
    torch.testing.assert_close(sumsq.sum(0), summed.float().pow(2).sum(-1), rtol=1e-5, atol=0)
    norm_weight = (1 + 0.2 * torch.randn(n_out, device="cuda")).bfloat16()
    for n_next in (4096, 12288):
        w_next = (torch.randn(n_next, n_out, device="cuda") / n_out**0.5).bfloat16()
        got = skinny_linear(summed, w_next, norm=RowNorm(norm_weight, 1e-6, sumsq))
        normed = rms_norm(summed, norm_weight, 1e-6)
        want = skinny_linear(normed, w_next)
        # x * weight rounded, scaled by 1 / rms after the sums, against the normalised x
        # rounded twice: a step or two of bf16 per term apart
        bound = 2**-7 * (normed.float().abs() @ w_next.float().abs().T) + 1e-3
        assert torch.all((got.float() - want.float()).abs() <= bound)
        unnormed = skinny_linear(summed, w_next)
        assert (got.float() - unnormed.float()).abs().max() > 10 * bound.max()


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


@gpu
@pytest.mark.parametrize(
    "late_trigger,prefetch_k", [(False, 0), (True, 0), (True, 256), (False, 64)]
)
def test_dependent_chain_under_programmatic_launch(late_trigger, prefetch_k):
    """A layer's chain of dependent calls (o_proj adding the residual, gate/up through the
    norm, the gated split down_proj adding the residual, q/k/v through the norm) replayed
    in a CUDA graph with the linear family under programmatic dependent launch, whatever
    the trigger and prefetch depth: bit for bit the chain without it."""
    from dataclasses import replace

    from sparrow.kernels.linear import RowNorm
    from sparrow.kernels.runtime import programmatic_launch

    rows, hidden, inner = 16, 2048, 6144
    attended, w_o, _ = operands(rows, hidden, hidden, torch.bfloat16, 1, "cuda")
    _, w_gate_up, _ = operands(rows, 2 * inner, hidden, torch.bfloat16, 2, "cuda")
    _, w_down, _ = operands(rows, hidden, inner, torch.bfloat16, 3, "cuda")
    _, w_qkv, _ = operands(rows, 4096, hidden, torch.bfloat16, 4, "cuda")
    norm_weight = (1 + 0.2 * torch.randn(hidden, device="cuda")).bfloat16()
    residual = torch.randn(rows, hidden, device="cuda").bfloat16()

    def layer():
        def call(x, w, **kw):
            launch = replace(
                default_launch(rows, w.shape[0], w.shape[1], 132),
                late_trigger=late_trigger,
                prefetch_k=prefetch_k,
            )
            return skinny_linear(x, w, launch=launch, **kw)

        s, sq = call(attended, w_o, residual=residual)
        gate_up = call(s, w_gate_up, norm=RowNorm(norm_weight, 1e-6, sq))
        s, sq = call(gate_up, w_down, gated=True, residual=s)
        return call(s, w_qkv, norm=RowNorm(norm_weight, 1e-6, sq))

    plain = layer()
    with programmatic_launch("linear"):
        layer()  # compiles the PDL variants and allocates before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer()
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, plain)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_residual_and_norm_fold(interpreted, launch):
    """A residual call returns residual + product and its rows' sums of squares in parts;
    a RowNorm call given those parts equals RMSNorm-then-product (the norm from x itself).
    A wrong add, wrong sums or a norm skipped is far off."""
    from sparrow.kernels.linear import RowNorm
    from sparrow.kernels.rms_norm import rms_norm_reference

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(6, 64, generator=gen).bfloat16()
    w_out = (torch.randn(256, 64, generator=gen) / 8).bfloat16()
    residual = (3 * torch.randn(6, 256, generator=gen)).bfloat16()
    summed, sumsq = skinny_linear(a, w_out, residual=residual, launch=launch)
    product = a.double() @ w_out.double().T
    # one rounding of the product, one of the sum (the interpreter truncates: two steps)
    step = 2.0**-7
    want = residual.double() + product
    assert summed.dtype == torch.bfloat16
    assert torch.all((summed.double() - want).abs() <= 2 * step * (want.abs() + product.abs()))
    assert sumsq.dtype == torch.float32 and sumsq.shape[1] == 6
    torch.testing.assert_close(sumsq.sum(0), summed.float().pow(2).sum(-1), rtol=1e-5, atol=0)

    norm_weight = (1 + 0.2 * torch.randn(256, generator=gen)).bfloat16()
    w = (torch.randn(48, 256, generator=gen) / 16).bfloat16()
    got = skinny_linear(summed, w, launch=launch, norm=RowNorm(norm_weight, 1e-6, sumsq))
    normed = rms_norm_reference(summed, norm_weight, 1e-6).double()
    # each normalised x may sit a rounding step (two where the interpreter truncates) off
    bound = 2 * step * (normed.abs() @ w.double().abs().T) + step * (normed @ w.double().T).abs()
    assert torch.all((got.double() - normed @ w.double().T).abs() <= bound)
    unnormed = summed.double() @ w.double().T
    assert (got.double() - unnormed).abs().max() > 0.5


def test_residual_split_sums_in_column_blocks(interpreted):
    """down_proj's shape of call (split over K, the last piece writes): the sums of squares
    come from the summed output, one row of parts per column block."""
    x, w, _ = operands(3, 64, 256, torch.bfloat16, seed=9)
    residual = torch.randn(3, 64).bfloat16()
    launch = LinearLaunch(block_n=16, block_k=32, split=4)
    summed, sumsq = skinny_linear(x, w, residual=residual, launch=launch)
    assert sumsq.shape == (4, 3)
    blocks = summed.float().view(3, 4, 16).pow(2).sum(-1).T
    torch.testing.assert_close(sumsq, blocks, rtol=1e-6, atol=0)


def test_residual_reference_off_kernel():
    """Where the kernel does not run (CPU without the interpreter), the reference gives the
    same pair: the sum and [1, M] sums of squares; a norm call ignores the parts it is given
    and normalises x itself."""
    from sparrow.kernels.linear import RowNorm
    from sparrow.kernels.rms_norm import rms_norm_reference

    x, w, b = operands(4, 32, 64, torch.float32, seed=2)
    residual = torch.randn(4, 32)
    summed, sumsq = skinny_linear(x, w, b, residual=residual)
    assert torch.equal(summed, residual + F.linear(x, w, b))
    assert torch.equal(sumsq, summed.pow(2).sum(-1)[None])
    norm_weight = torch.rand(64) + 0.5
    got = skinny_linear(x, w, norm=RowNorm(norm_weight, 1e-6, torch.zeros(1, 4)))
    assert torch.equal(got, F.linear(rms_norm_reference(x, norm_weight, 1e-6), w))


def test_norm_and_residual_checks():
    from sparrow.kernels.linear import RowNorm

    x, w, _ = operands(4, 32, 64, torch.bfloat16)
    with pytest.raises(KernelInputError, match="norm's weight must be"):
        skinny_linear(x, w, norm=RowNorm(torch.ones(63).bfloat16(), 1e-6, torch.zeros(1, 4)))
    with pytest.raises(KernelInputError, match="residual must be"):
        skinny_linear(x, w, residual=torch.zeros(4, 31).bfloat16())
    gate_up = torch.zeros(4, 128).bfloat16()
    with pytest.raises(KernelInputError, match="gated call takes no norm"):
        skinny_linear(
            gate_up, w, gated=True, norm=RowNorm(torch.ones(64).bfloat16(), 1e-6, torch.zeros(1, 4))
        )
