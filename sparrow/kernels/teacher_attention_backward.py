"""Backward of the teacher-forced block-sparse attention (kernels/teacher_attention.py), and
the differentiable attention built from both.

    out = teacher_sparse_attention_trainable(q, k, v, bits, seq_starts, seq_lens, page_size)
    out.backward(grad_out)                         # q.grad, k.grad, v.grad
    dq, dk, dv = teacher_attention_backward(q, k, v, bits, seq_starts, seq_lens, page_size,
                                            out, lse, grad_out)

Flash-attention-2's backward over the same packing and the same bits: the forward saved
each row's log2-sum-exp2 (lse), so a tile's probabilities are p = exp2(s * log2(e) / sqrt(D)
- lse) with no running max, and delta = rowsum(dO * O) comes first (one torch reduction).
Two kernels, neither with atomics:
- dK, dV: one program per (KV tile, KV head, sequence) keeps its tile's K and V and its dK,
  dV accumulators, and walks the query blocks from the tile's first position to the
  sequence's end: dV += p^T dO, dK += (p * (dO V^T - delta))^T Q / sqrt(D). The group's query
  heads ride in the M dimension as in the forward, so the sum over a group's heads is the
  tile product itself.
- dQ: one program per (query block, KV head, sequence), the forward's loop again:
  dQ += (p * (dO V^T - delta)) K / sqrt(D).
Both read a row's bits one int32 word per tile and skip a (query block, KV tile) pair that no
row of the block selects, as the forward does. Rows outside every sequence get 0.
Off GPU the launcher returns the reference gradient: autograd of teacher_attention_reference.
Tests: `python -m pytest tests/kernels/test_teacher_attention_backward.py -q`.
"""

from __future__ import annotations

import math

import torch

from sparrow.kernels.runtime import check, jit, next_power_of_2, tl, use_kernel
from sparrow.kernels.teacher_attention import (
    LOG2E,
    _check,
    teacher_attention_reference,
    teacher_sparse_attention,
)


@jit
def _dot(a, b, IEEE: tl.constexpr):
    """float32 operands in IEEE precision (tests compare at 1e-4), else the tensor cores'."""
    if IEEE:
        product = tl.dot(a, b, input_precision="ieee")
    else:
        product = tl.dot(a, b)
    return product


@jit
def _tile_grads(
    q,
    do,
    lse,
    delta,
    keys,
    values,
    pos,
    key,
    tile_bits,
    qk_scale,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    """p and dS = p * (dO V^T - delta) [BLOCK_M, BLOCK_N] of a (query block, KV tile)
    pair; both 0 where a row does not read the key."""
    n = tl.arange(0, BLOCK_N)
    qk = _dot(q, tl.trans(keys), IEEE)
    page_bit = (tile_bits[:, None] >> (n // PAGE)[None, :]) & 1
    read = (page_bit != 0) & (key[None, :] <= pos[:, None])
    # tl.where, not a product: exp2 of an unread score may overflow to inf
    p = tl.where(read, tl.exp2(qk * qk_scale - lse[:, None]), 0.0)
    dp = _dot(do, tl.trans(values), IEEE)
    return p, p * (dp - delta[:, None])


@jit
def _rows(bits_row, row_ok, page0, TILE_MASK: tl.constexpr):
    """The tile's page bits of each row (0 for rows outside the sequence)."""
    # 32 pages a word (compiled Triton reads no plain Python global such as WORD)
    word = tl.load(bits_row + page0 // 32, mask=row_ok, other=0)
    return (word >> (page0 % 32)) & TILE_MASK


@jit
def _dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    bits_ptr,
    start_ptr,
    len_ptr,
    dk_ptr,
    dv_ptr,
    s_qt,
    s_qh,
    s_kt,
    s_kh,
    s_bh,
    s_bt,
    s_lt,
    dim,
    qk_scale,
    sm_scale,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    EVEN_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    """q, do share strides (s_qt, s_qh); k, v, dk, dv share (s_kt, s_kh)."""
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    TILE_MASK: tl.constexpr = (1 << (BLOCK_N // PAGE)) - 1
    j0 = tl.program_id(0) * BLOCK_N
    hk = tl.program_id(1)
    b = tl.program_id(2)
    start = tl.load(start_ptr + b).to(tl.int64)
    length = tl.load(len_ptr + b).to(tl.int32)
    key = j0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = (d < BLOCK_D) if EVEN_D else (d < dim)
    kv_mask = (key < length)[:, None] & d_ok[None, :]
    kv_offset = (start + key)[:, None] * s_kt + hk * s_kh + d[None, :]
    keys = tl.load(k_ptr + kv_offset, mask=kv_mask, other=0.0)
    values = tl.load(v_ptr + kv_offset, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    r = tl.arange(0, BLOCK_M)
    page0 = j0 // PAGE
    # causal: only positions at or after the tile's first key read it
    for first in range((j0 // BLOCK_Q) * BLOCK_Q, length, BLOCK_Q):
        pos = first + r // GROUP
        row_ok = (r < BLOCK_Q * GROUP) & (pos < length)
        tile_bits = _rows(bits_ptr + hk * s_bh + (start + pos) * s_bt, row_ok, page0, TILE_MASK)
        if tl.max(tile_bits, axis=0) > 0:
            head = hk * GROUP + r % GROUP
            row_offset = (start + pos) * s_lt + head
            q_offset = (start + pos)[:, None] * s_qt + head[:, None] * s_qh + d[None, :]
            q_mask = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_ptr + q_offset, mask=q_mask, other=0.0)
            do = tl.load(do_ptr + q_offset, mask=q_mask, other=0.0)
            lse = tl.load(lse_ptr + row_offset, mask=row_ok, other=0.0)
            delta = tl.load(delta_ptr + row_offset, mask=row_ok, other=0.0)
            p, ds = _tile_grads(
                q, do, lse, delta, keys, values, pos, key, tile_bits, qk_scale, PAGE, BLOCK_N, IEEE
            )
            dv += _dot(tl.trans(p).to(do.dtype), do, IEEE)
            dk += _dot(tl.trans(ds).to(q.dtype), q, IEEE)
    tl.store(dk_ptr + kv_offset, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv_offset, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@jit
def _dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    bits_ptr,
    start_ptr,
    len_ptr,
    dq_ptr,
    s_qt,
    s_qh,
    s_kt,
    s_kh,
    s_bh,
    s_bt,
    s_lt,
    dim,
    qk_scale,
    sm_scale,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    EVEN_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    """q, do, dq share strides (s_qt, s_qh); k, v share (s_kt, s_kh)."""
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    TILE_MASK: tl.constexpr = (1 << (BLOCK_N // PAGE)) - 1
    # the last query blocks hold the longest rows: start them first
    first = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_Q
    hk = tl.program_id(1)
    b = tl.program_id(2)
    start = tl.load(start_ptr + b).to(tl.int64)
    length = tl.load(len_ptr + b).to(tl.int32)
    r = tl.arange(0, BLOCK_M)
    pos = first + r // GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (pos < length)
    head = hk * GROUP + r % GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = (d < BLOCK_D) if EVEN_D else (d < dim)
    q_offset = (start + pos)[:, None] * s_qt + head[:, None] * s_qh + d[None, :]
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_offset, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + q_offset, mask=q_mask, other=0.0)
    row_offset = (start + pos) * s_lt + head
    lse = tl.load(lse_ptr + row_offset, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + row_offset, mask=row_ok, other=0.0)
    bits_row = bits_ptr + hk * s_bh + (start + pos) * s_bt
    key_end = tl.where(first < length, tl.minimum(length, first + BLOCK_Q), 0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for j0 in range(0, key_end, BLOCK_N):
        tile_bits = _rows(bits_row, row_ok, j0 // PAGE, TILE_MASK)
        if tl.max(tile_bits, axis=0) > 0:
            key = j0 + tl.arange(0, BLOCK_N)
            kv_mask = (key < length)[:, None] & d_ok[None, :]
            kv_offset = (start + key)[:, None] * s_kt + hk * s_kh + d[None, :]
            keys = tl.load(k_ptr + kv_offset, mask=kv_mask, other=0.0)
            values = tl.load(v_ptr + kv_offset, mask=kv_mask, other=0.0)
            p, ds = _tile_grads(
                q, do, lse, delta, keys, values, pos, key, tile_bits, qk_scale, PAGE, BLOCK_N, IEEE
            )
            dq += _dot(ds.to(keys.dtype), keys, IEEE)
    tl.store(dq_ptr + q_offset, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


# reference


def teacher_attention_reference_grad(
    q, k, v, bits, seq_starts, seq_lens, page_size, grad_out
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv by autograd of teacher_attention_reference (float32 inside), in the
    inputs' dtypes."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = teacher_attention_reference(*leaves, bits, seq_starts, seq_lens, page_size)
        return torch.autograd.grad(out, leaves, grad_out)


# launchers


def _blocks(q, k, page_size, block_m, block_n, default_m, default_n):
    group = q.shape[1] // k.shape[1]
    block_m = block_m or max(default_m, next_power_of_2(group))
    block_n = block_n or max(page_size, min(default_n, 16 * page_size))
    check(
        block_n % page_size == 0
        and block_n // page_size <= 16
        and block_n >= 16
        and block_m >= max(16, group),
        f"block_n {block_n} must be a multiple of "
        f"page_size {page_size} of at most 16 pages and >= 16, block_m {block_m} >= "
        f"max(16, group {group})",
    )
    return group, block_m, block_n


def teacher_attention_backward(
    q,
    k,
    v,
    bits,
    seq_starts,
    seq_lens,
    page_size: int,
    out,
    lse,
    grad_out,
    *,
    max_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
):
    """dq, dk, dv (q's and k's shapes and dtypes) of teacher_sparse_attention's `out`, given
    grad_out and the lse its forward stored; off GPU the reference gradient (out and lse
    unused). block_m, block_n, num_warps, num_stages: both kernels' launch when given (by
    default dK/dV 32 x 64 and dQ 64 x 32 rows x keys, 8 warps from head dim 128 on: dK/dV
    hold two float32 [BLOCK_N, D] accumulators besides their tiles)."""
    _check(q, k, v, bits, seq_starts, seq_lens, page_size)
    check(
        grad_out.shape == q.shape
        and out.shape == q.shape
        and lse.shape == q.shape[:2]
        and lse.dtype == torch.float32,
        f"out, grad_out must be like q {tuple(q.shape)} and "
        f"lse float32 [N, Hq], got {tuple(out.shape)}, {tuple(grad_out.shape)}, "
        f"{tuple(lse.shape)} {lse.dtype}",
    )
    if not use_kernel(q, k, v, bits, seq_starts, seq_lens, out, lse, grad_out):
        return teacher_attention_reference_grad(
            q, k, v, bits, seq_starts, seq_lens, page_size, grad_out
        )
    # one stride pair for q, do, dq and one for k, v, dk, dv: make them all contiguous
    q, k, v, grad_out, lse = (t.contiguous() for t in (q, k, v, grad_out, lse))
    if max_len is None:
        max_len = max(seq_lens.tolist(), default=0)
    # default tiles as flash-attention-2's: few query rows against a wide KV tile for dK/dV,
    # the other way round for dQ (at the 1.7B shape, 8 warps, sm_90: ptxas spills neither)
    group, kv_m, kv_n = _blocks(q, k, page_size, block_m, block_n, 32, 64)
    _, q_m, q_n = _blocks(q, k, page_size, block_m, block_n, 64, 32)
    delta = (grad_out.float() * out.float()).sum(-1)  # [N, Hq], rowsum(dO * O)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    total, heads, dim = q.shape
    batch = seq_lens.shape[0]
    if not (batch and total and max_len):
        return dq, dk, dv
    block_d = max(16, next_power_of_2(dim))
    common = dict(
        GROUP=group,
        BLOCK_D=block_d,
        PAGE=page_size,
        EVEN_D=dim == block_d,
        IEEE=q.dtype == torch.float32,
        num_stages=num_stages,
        num_warps=num_warps or (8 if block_d >= 128 else 4),
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        bits.stride(0),
        bits.stride(1),
        heads,
        dim,
        LOG2E / math.sqrt(dim),
        1.0 / math.sqrt(dim),
    )
    kv_heads = k.shape[1]
    _dkdv_kernel[(-(-max_len // kv_n), kv_heads, batch)](
        q,
        k,
        v,
        grad_out,
        lse,
        delta,
        bits,
        seq_starts,
        seq_lens,
        dk,
        dv,
        *strides,
        BLOCK_M=kv_m,
        BLOCK_N=kv_n,
        **common,
    )
    _dq_kernel[(-(-max_len // (q_m // group)), kv_heads, batch)](
        q,
        k,
        v,
        grad_out,
        lse,
        delta,
        bits,
        seq_starts,
        seq_lens,
        dq,
        *strides,
        BLOCK_M=q_m,
        BLOCK_N=q_n,
        **common,
    )
    return dq, dk, dv


class _TeacherSparseAttention(torch.autograd.Function):
    """The forward kernel (saving lse) and the backward kernels above."""

    @staticmethod
    def forward(ctx, q, k, v, bits, seq_starts, seq_lens, page_size, max_len):
        lse = torch.zeros(q.shape[:2], dtype=torch.float32, device=q.device)
        # zeros: rows outside every sequence are 0, as the reference's
        out = teacher_sparse_attention(
            q,
            k,
            v,
            bits,
            seq_starts,
            seq_lens,
            page_size,
            max_len=max_len,
            lse=lse,
            out=torch.zeros_like(q),
        )
        ctx.save_for_backward(q, k, v, bits, seq_starts, seq_lens, out, lse)
        ctx.page_size, ctx.max_len = page_size, max_len
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bits, seq_starts, seq_lens, out, lse = ctx.saved_tensors
        dq, dk, dv = teacher_attention_backward(
            q,
            k,
            v,
            bits,
            seq_starts,
            seq_lens,
            ctx.page_size,
            out,
            lse,
            grad_out,
            max_len=ctx.max_len,
        )
        return dq, dk, dv, None, None, None, None, None


def teacher_sparse_attention_trainable(
    q, k, v, bits, seq_starts, seq_lens, page_size: int, *, max_len: int | None = None
) -> torch.Tensor:
    """teacher_sparse_attention with a backward: the kernels on kernel tensors, else the
    reference, whose autograd is the reference gradient."""
    if not use_kernel(q, k, v, bits, seq_starts, seq_lens):
        _check(q, k, v, bits, seq_starts, seq_lens, page_size)
        return teacher_attention_reference(q, k, v, bits, seq_starts, seq_lens, page_size)
    if max_len is None:
        max_len = max(seq_lens.tolist(), default=0)
    return _TeacherSparseAttention.apply(q, k, v, bits, seq_starts, seq_lens, page_size, max_len)
