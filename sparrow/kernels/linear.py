"""Skinny linear layer for decode: y = x @ W^T (+ bias) for a few rows x, read-bound on W.

    y = skinny_linear(x, weight, bias)          # x [M, K], weight [N, K] -> [M, N]
    s, sumsq = skinny_linear(a, w_o, residual=x)                  # s = x + a @ w_o^T
    y = skinny_linear(s, w_qkv, norm=RowNorm(norm_weight, eps, sumsq))   # rms_norm(s) @ w^T

A decode step multiplies a few (here up to 16) token rows by every weight matrix of the
model once, so its projections are matrix-vector products in disguise: the time is the weight bytes over the
memory bandwidth. This kernel streams W in [BLOCK_N, BLOCK_K] tiles (one or several column
blocks per program, pipelined over K) against the rows of x, held whole in one BLOCK_M tile.
With few column blocks (o_proj, down_proj: N = hidden size) the K range is also cut into
`split` pieces, each program writing a float32 partial; the last program of a column
block to arrive (arrival_counters) sums the partials and writes the output, so it stays
one launch. Sums are float32 and rounded once, like cuBLAS's, but in another order: results
equal F.linear to rounding, not bit for bit. The RMSNorm before a projection and the residual
add after one can ride in the kernel (model/stream.py): `residual=` adds the residual as the
output is written and returns the sums of squares of the new rows per column block, which a
later call's RowNorm uses to scale its sums, so a layer launches no norm kernel.

Off GPU, under autograd, or for shapes it does not take (more than MAX_ROWS rows, K not a
multiple of the K tile, 32-bit floats) the launcher runs the reference (`F.linear`, after
silu_mul when gated, the norm kernel's reference with a RowNorm); KernelOptions.skinny_linear
off (runtime.py) makes it do so always (cuBLAS, to compare).
Tests: `python -m pytest tests/kernels/test_linear.py -q`;
benchmark: `python3 benchmarks/linear.py` (against cuBLAS in the same process).
"""

from __future__ import annotations

import torch

from sparrow.kernels.linear_launch import (
    LinearLaunch,
    default_launch,
    pipeline_stages,
    prefetch_lines,
)
from sparrow.kernels.linear_reference import RowNorm, skinny_linear_reference
from sparrow.kernels.rms_norm import needs_autograd
from sparrow.kernels.runtime import (
    INTERPRETER,
    arrival_counters,
    check,
    current_options,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    multiprocessors,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)

# decode batches up to this many rows take the kernel: at 64 rows cuBLAS is as fast per
# projection and the gated down projection measured far slower (H100, benchmarks/linear.py)
MAX_ROWS = 16


@jit
def _skinny_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    rows,
    n_out,
    k_len,
    k_per_split,
    s_xm,
    s_wn,
    s_om,
    nw_ptr,
    sq_in_ptr,
    sq_blocks,
    eps,
    res_ptr,
    sq_out_ptr,
    s_rm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    W_MAJOR: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    SQ_BLOCKS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
    LATE_TRIGGER: tl.constexpr,
):
    pid_n = tl.program_id(0)
    piece = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    m_mask = m < rows
    n_mask = n < n_out
    start = piece * k_per_split
    norm_w = nw_ptr + kk
    x_rows = x_ptr + m[:, None] * s_xm + kk[None, :]
    w_rows = w_ptr + n.to(tl.int64)[:, None] * s_wn + kk[None, :]
    keep = m_mask[:, None] & n_mask[None, :]
    if W_MAJOR:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if PDL:
        # the weights do not depend on the kernel before: ask the L2 for the start of this
        # program's slice (launch.prefetch_k) while that kernel still runs, then wait for x
        _prefetch_l2(w_ptr, n, n_out, s_wn, start, k_per_split, PREFETCH_LINES)
        gdc_wait()
        if not LATE_TRIGGER:
            gdc_launch_dependents()
    # issued now, used after the loop: the epilogue does not wait on a fresh load
    sq_parts, res = _early_loads(
        sq_in_ptr, sq_blocks, rows, res_ptr, s_rm, m, n, m_mask, keep, SQ_BLOCKS, NORM, RESIDUAL
    )
    for k0 in tl.range(start, piece * k_per_split + k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        x = _load_x(x_rows, k0, k_len, m_mask, GATED, norm_w, NORM)
        w = tl.load(w_rows + k0, mask=n_mask[:, None], other=0.0)
        acc = _accumulate(acc, x, w, W_MAJOR, UPCAST)
    if PDL and LATE_TRIGGER:
        gdc_launch_dependents()
    if W_MAJOR:
        acc = tl.trans(acc)
    if SPLIT > 1:
        # partials of this column block, then the last piece to arrive sums them in order
        part = part_ptr + m[:, None] * n_out + n[None, :]
        tl.store(part + piece * rows * n_out, acc, mask=keep)
        tl.debug_barrier()  # every thread's partial is issued before the release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(part + s * rows * n_out, mask=keep, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)
            _store_out(
                acc,
                b_ptr,
                out_ptr,
                m,
                n,
                n_mask,
                keep,
                s_om,
                HAS_BIAS,
                sq_parts,
                k_len,
                eps,
                res,
                sq_out_ptr + pid_n * rows,
                rows,
                NORM,
                RESIDUAL,
            )
    else:
        _store_out(
            acc,
            b_ptr,
            out_ptr,
            m,
            n,
            n_mask,
            keep,
            s_om,
            HAS_BIAS,
            sq_parts,
            k_len,
            eps,
            res,
            sq_out_ptr + pid_n * rows,
            rows,
            NORM,
            RESIDUAL,
        )


@jit
def _prefetch_l2(w_ptr, n, n_out, s_wn, start, k_per_split, LINES: tl.constexpr):
    """Ask the L2 for the 128-byte lines of W's rows n over [start, start + k_per_split)
    (16-bit weights: 64 per line), at most LINES per row; no register holds them."""
    row = tl.minimum(n, n_out - 1).to(tl.int64)
    col = start + tl.maximum(tl.minimum(tl.arange(0, LINES) * 64, k_per_split - 64), 0)
    lines = w_ptr + row[:, None] * s_wn + col[None, :]
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // dummy $0",
        "=r,l",
        [lines],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@jit
def _early_loads(
    sq_ptr,
    sq_blocks,
    rows,
    res_ptr,
    s_rm,
    m,
    n,
    m_mask,
    keep,
    SQ_BLOCKS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    """NORM: x's rows' sums of squares in parts [SQ_BLOCKS, BLOCK_M] (from the column blocks
    of the kernel that wrote x); RESIDUAL: the residual's output tile. Zeros otherwise."""
    sq_parts = tl.zeros([SQ_BLOCKS, m.shape[0]], tl.float32)
    res = tl.zeros(keep.shape, tl.float32)
    if NORM:
        j = tl.arange(0, SQ_BLOCKS)
        sq_parts = tl.load(
            sq_ptr + j[:, None] * rows + m[None, :],
            mask=(j < sq_blocks)[:, None] & m_mask[None, :],
            other=0.0,
        )
    if RESIDUAL:
        res = tl.load(res_ptr + m[:, None] * s_rm + n[None, :], mask=keep, other=0.0).to(tl.float32)
    return sq_parts, res


@jit
def _load_x(x_rows, k0, k_len, m_mask, GATED: tl.constexpr, norm_w, NORM: tl.constexpr):
    """x's tile at k0; GATED: silu(gate) * up from x = [gate | up] (each k_len wide), rounded
    as kernels/silu_mul.py rounds it (silu in float32 to the dtype, then the product); NORM:
    x times the RMSNorm's weight, rounded to the dtype (the rows' 1 / rms scales the sums)."""
    dtype = x_rows.dtype.element_ty
    if GATED:
        gate = tl.load(x_rows + k0, mask=m_mask[:, None], other=0.0).to(tl.float32)
        up = tl.load(x_rows + k_len + k0, mask=m_mask[:, None], other=0.0).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        return (silu * up).to(dtype)
    x = tl.load(x_rows + k0, mask=m_mask[:, None], other=0.0)
    if NORM:
        x = (x.to(tl.float32) * tl.load(norm_w + k0).to(tl.float32)[None, :]).to(dtype)
    return x


@jit
def _accumulate(acc, x, w, W_MAJOR: tl.constexpr, UPCAST: tl.constexpr):
    """acc + x @ w^T, or its transpose when W's tile is the tensor core's M side."""
    if UPCAST:  # Triton's CPU interpreter multiplies 16-bit floats wrongly
        x, w = x.to(tl.float32), w.to(tl.float32)
    if W_MAJOR:
        acc = tl.dot(w, tl.trans(x), acc)
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@jit
def _store_out(
    acc,
    b_ptr,
    out_ptr,
    m,
    n,
    n_mask,
    keep,
    s_om,
    HAS_BIAS: tl.constexpr,
    sq_parts,
    k_len,
    eps,
    res,
    sq_ptr,
    rows,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    """The output tile. NORM: the sums scaled by each row's 1 / rms first (from sq_parts).
    RESIDUAL: res + output instead (the output rounded to the dtype first, the sum in float32
    rounded once: kernels/rms_norm.py's residual add), and the sum of squares of this
    block's columns of each row at sq_ptr."""
    dtype = out_ptr.dtype.element_ty
    if NORM:
        acc = acc * tl.rsqrt(tl.sum(sq_parts, axis=0) / k_len + eps)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if RESIDUAL:
        out = (res + acc.to(dtype).to(tl.float32)).to(dtype)
        kept = tl.where(keep, out.to(tl.float32), 0.0)
        tl.store(sq_ptr + m, tl.sum(kept * kept, axis=1), mask=m < rows)
    else:
        out = acc.to(dtype)
    tl.store(out_ptr + m[:, None] * s_om + n[None, :], out, mask=keep)


def takes(
    x: torch.Tensor,
    weight: torch.Tensor,
    launch: LinearLaunch,
    k_len: int,
    norm: RowNorm | None = None,
    residual: torch.Tensor | None = None,
) -> bool:
    """Whether the kernel serves this call (else the reference does)."""
    rows = x.shape[0] if x.dim() == 2 else 0
    return (
        current_options().skinny_linear
        and use_kernel(x, weight)
        and x.dim() == 2
        and 0 < rows <= MAX_ROWS
        and x.dtype == weight.dtype
        and x.dtype in (torch.bfloat16, torch.float16)
        and k_len % (launch.block_k * launch.split) == 0
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
        and not needs_autograd(x, weight)
        and (
            norm is None
            or (
                norm.weight.dtype == x.dtype
                and norm.weight.is_contiguous()
                and norm.sumsq.dtype == torch.float32
                and norm.sumsq.is_contiguous()
                and norm.sumsq.dim() == 2
                and norm.sumsq.shape[1] == rows
                and use_kernel(norm.weight, norm.sumsq)
                and not needs_autograd(norm.weight)
            )
        )
        and (
            residual is None
            or (
                residual.dtype == x.dtype
                and residual.stride(-1) == 1
                and use_kernel(residual)
                and not needs_autograd(residual)
            )
        )
    )


def serves(
    x: torch.Tensor,
    weight: torch.Tensor,
    gated: bool = False,
    norm: RowNorm | None = None,
    residual: torch.Tensor | None = None,
) -> bool:
    """Whether skinny_linear would run its kernel on this call with the default launch
    (callers choose between a fused form and their own fallback with it)."""
    if x.dim() != 2 or weight.dim() != 2:
        return False
    k_len = weight.shape[1]
    launch = default_launch(x.shape[0], weight.shape[0], k_len, multiprocessors(x.device))
    return takes(x, weight, launch, k_len, norm, residual) and not (gated and norm is not None)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    launch: LinearLaunch | None = None,
    gated: bool = False,
    norm: RowNorm | None = None,
    residual: torch.Tensor | None = None,
):
    """x [M, K] @ weight[N, K]^T (+ bias [N]) -> [M, N] in x's dtype (F.linear's contract).
    gated: x is [M, 2K] = [gate | up] and the product is silu(gate) * up @ weight^T, the
    SwiGLU gate applied as x is read (the MLP's down projection without its own launch).
    norm: x's rows go through that RMSNorm as they are read (the norm's launch folded in).
    residual [M, N]: returns (residual + y, the sums of squares of its rows in parts
    [blocks, M] float32), the pair a later call's RowNorm takes; off the kernel, blocks is
    the given launch's column blocks, or 1 without a launch."""
    k_len = weight.shape[-1]
    width = 2 * k_len if gated else k_len
    check(
        weight.dim() == 2 and x.shape[-1] == width,
        f"weight must be [N, {x.shape[-1] // (2 if gated else 1)}] for x of width "
        f"{x.shape[-1]}{' (gate and up)' if gated else ''}, got {tuple(weight.shape)}",
    )
    check(
        bias is None or tuple(bias.shape) == (weight.shape[0],),
        f"bias must be [{weight.shape[0]}], got {None if bias is None else tuple(bias.shape)}",
    )
    check(not (gated and norm is not None), "a gated call takes no norm")
    check(
        norm is None or tuple(norm.weight.shape) == (k_len,),
        f"the norm's weight must be [{k_len}], got "
        f"{None if norm is None else tuple(norm.weight.shape)}",
    )
    rows, n_out = x.shape[0], weight.shape[0]
    check(
        residual is None or tuple(residual.shape) == (rows, n_out),
        f"residual must be [{rows}, {n_out}], got "
        f"{None if residual is None else tuple(residual.shape)}",
    )
    # a caller's own launch fixes the column blocks of the sums of squares, kernel or not
    block_n = None if launch is None else launch.block_n
    if x.dim() == 2 and launch is None:
        launch = default_launch(rows, n_out, k_len, multiprocessors(x.device))
    if launch is None or not takes(x, weight, launch, k_len, norm, residual):
        return skinny_linear_reference(x, weight, bias, gated, norm, residual, block_n)
    out = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    blocks = -(-n_out // launch.block_n)
    part = counts = out
    if launch.split > 1:
        part = torch.empty(launch.split, rows, n_out, dtype=torch.float32, device=x.device)
        counts = arrival_counters(x.device, blocks, "skinny_linear")
    sumsq = (
        torch.empty(blocks, rows, dtype=torch.float32, device=x.device)
        if residual is not None
        else part
    )
    pdl = pdl_launch(x.device, "linear")
    _skinny_linear_kernel[(blocks, launch.split)](
        x,
        weight,
        bias if bias is not None else weight,
        out,
        part,
        counts,
        rows,
        n_out,
        k_len,
        k_len // launch.split,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        weight if norm is None else norm.weight,
        part if norm is None else norm.sumsq,
        0 if norm is None else norm.sumsq.shape[0],
        0.0 if norm is None else norm.eps,
        out if residual is None else residual,
        sumsq,
        0 if residual is None else residual.stride(0),
        BLOCK_M=max(16, next_power_of_2(rows)),
        BLOCK_N=launch.block_n,
        BLOCK_K=launch.block_k,
        SPLIT=launch.split,
        HAS_BIAS=bias is not None,
        W_MAJOR=launch.w_major,
        NUM_STAGES=pipeline_stages(launch, rows),
        UPCAST=INTERPRETER,
        PDL=pdl,
        GATED=gated,
        NORM=norm is not None,
        SQ_BLOCKS=1 if norm is None else max(2, next_power_of_2(norm.sumsq.shape[0])),
        RESIDUAL=residual is not None,
        PREFETCH_LINES=prefetch_lines(launch, k_len),
        LATE_TRIGGER=launch.late_trigger,
        num_warps=launch.num_warps,
        launch_pdl=pdl,
    )
    return out if residual is None else (out, sumsq)
