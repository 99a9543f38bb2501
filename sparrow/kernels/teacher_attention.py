"""Teacher-forced block-sparse attention: every position of packed sequences at once, each
query reading, per KV head, the pages its own bits select, causally.

    out = teacher_sparse_attention(q, k, v, bits, seq_starts, seq_lens, page_size)

q [N, Hq, D]; k, v [N, Hkv, D] (sequences packed one after another: sequence b holds rows
seq_starts[b] .. seq_starts[b] + seq_lens[b] - 1, positions 0 ..); bits [Hkv, N, words] int32
from teacher_pages.py (page p of a row: bit p % 32 of word p // 32). Query head h of KV group
h // (Hq / Hkv) at position t reads key position j of its sequence when j <= t and the bit
of j's page (j // page_size) is set in row t: exact softmax (scale 1/sqrt(D), float32
accumulation) over those keys, out [N, Hq, D] in q's dtype; a row that reads nothing is 0.

A flash-attention forward. One program per (block of positions, KV head, sequence); the
group's query heads share the positions' bits, so they ride in the M dimension of one tile
(BLOCK_M = positions x group rows): each K/V tile is loaded once for the whole group, and a
row's bits are loaded once per tile, one int32 word, and expanded to the tile's [BLOCK_M,
BLOCK_N] mask by a shift per page. A KV tile that no row of the block selects is skipped
before its K and V are loaded (the block's OR of those words). Programs take query blocks
from the last, so the longest rows start first. Given `lse`, it also stores each row's
log2-sum-exp2, from which kernels/teacher_attention_backward.py (dQ, dK, dV and the
autograd Function around both) rebuilds the softmax. Off GPU the launcher runs
`teacher_attention_reference`.
Tests: `python -m pytest tests/kernels/test_teacher_attention.py -q`.
"""

from __future__ import annotations

import math

import torch

from sparrow.kernels.runtime import (
    check,
    check_integer,
    check_last_dim_contiguous,
    jit,
    next_power_of_2,
    tl,
    use_kernel,
)
from sparrow.kernels.teacher_pages import WORD, unpack_page_bits

LOG2E = 1.4426950408889634


@jit
def _attend_tile(
    q,
    m,
    l_sum,
    acc,
    k_ptr,
    v_ptr,
    start,
    length,
    pos,
    tile_bits,
    j0,
    hk,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    d,
    d_ok,
    qk_scale,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One KV tile of the online softmax: keys j0 .. j0 + BLOCK_N - 1, each row reading
    those of its tile_bits' pages at or before its position."""
    n = tl.arange(0, BLOCK_N)
    key = j0 + n
    kv_mask = (key < length)[:, None] & d_ok[None, :]
    keys = tl.load(
        k_ptr + (start + key)[:, None] * s_kt + hk * s_kh + d[None, :], mask=kv_mask, other=0.0
    )
    if IEEE:
        qk = tl.dot(q, tl.trans(keys), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(keys))
    page_bit = (tile_bits[:, None] >> (n // PAGE)[None, :]) & 1
    read = (page_bit != 0) & (key[None, :] <= pos[:, None])
    qk = tl.where(read, qk * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, axis=1))
    # rows that read nothing yet keep m at -inf: exponentiate against 0 instead
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_safe[:, None])
    alpha = tl.exp2(m - m_safe)
    values = tl.load(
        v_ptr + (start + key)[:, None] * s_vt + hk * s_vh + d[None, :], mask=kv_mask, other=0.0
    )
    if IEEE:
        pv = tl.dot(p, values, input_precision="ieee")
    else:
        pv = tl.dot(p.to(values.dtype), values)
    return m_new, l_sum * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv


@jit
def _teacher_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bits_ptr,
    start_ptr,
    len_ptr,
    out_ptr,
    lse_ptr,
    s_qt,
    s_qh,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    s_bh,
    s_bt,
    s_ot,
    s_oh,
    s_lt,
    dim,
    qk_scale,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    EVEN_D: tl.constexpr,
    IEEE: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    TILE_MASK: tl.constexpr = (1 << (BLOCK_N // PAGE)) - 1
    # the last query blocks hold the longest rows: start them first
    qb = tl.num_programs(0) - 1 - tl.program_id(0)
    hk = tl.program_id(1)
    b = tl.program_id(2)
    start = tl.load(start_ptr + b).to(tl.int64)
    length = tl.load(len_ptr + b).to(tl.int32)
    first = qb * BLOCK_Q
    r = tl.arange(0, BLOCK_M)
    pos = first + r // GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (pos < length)
    head = hk * GROUP + r % GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = (d < BLOCK_D) if EVEN_D else (d < dim)
    q = tl.load(
        q_ptr + (start + pos)[:, None] * s_qt + head[:, None] * s_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    bits_row = bits_ptr + hk * s_bh + (start + pos) * s_bt
    # keys up to the block's last position; none for a block past the sequence's end
    key_end = tl.where(first < length, tl.minimum(length, first + BLOCK_Q), 0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for j0 in range(0, key_end, BLOCK_N):
        page0 = j0 // PAGE
        # 32 pages a word (compiled Triton reads no plain Python global such as WORD)
        word = tl.load(bits_row + page0 // 32, mask=row_ok, other=0)
        tile_bits = (word >> (page0 % 32)) & TILE_MASK  # >= 0: at most 16 pages a tile
        if SKIP_EMPTY:
            if tl.max(tile_bits, axis=0) > 0:
                m, l_sum, acc = _attend_tile(
                    q,
                    m,
                    l_sum,
                    acc,
                    k_ptr,
                    v_ptr,
                    start,
                    length,
                    pos,
                    tile_bits,
                    j0,
                    hk,
                    s_kt,
                    s_kh,
                    s_vt,
                    s_vh,
                    d,
                    d_ok,
                    qk_scale,
                    BLOCK_N,
                    PAGE,
                    IEEE,
                )
        else:
            m, l_sum, acc = _attend_tile(
                q,
                m,
                l_sum,
                acc,
                k_ptr,
                v_ptr,
                start,
                length,
                pos,
                tile_bits,
                j0,
                hk,
                s_kt,
                s_kh,
                s_vt,
                s_vh,
                d,
                d_ok,
                qk_scale,
                BLOCK_N,
                PAGE,
                IEEE,
            )
    read_any = l_sum > 0
    out = acc / tl.where(read_any, l_sum, 1.0)[:, None]
    tl.store(
        out_ptr + (start + pos)[:, None] * s_ot + head[:, None] * s_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    if STORE_LSE:
        # log2 of the row's softmax denominator, for the backward to rebuild p without the
        # running max; 0 for a row that reads nothing (its scores are all -inf, so p is 0)
        lse = tl.where(read_any, m + tl.log2(tl.where(read_any, l_sum, 1.0)), 0.0)
        tl.store(lse_ptr + (start + pos) * s_lt + head, lse, mask=row_ok)


# reference


def teacher_attention_reference(
    q,
    k,
    v,
    bits,
    seq_starts,
    seq_lens,
    page_size,
    query_chunk: int = 1024,
    lse: torch.Tensor | None = None,
):
    """The same attention by masked float32 softmax, per sequence and chunk of positions;
    rows outside every sequence are 0; differentiable in q, k, v (its autograd is the
    reference gradient); lse as the launcher's."""
    out = torch.zeros_like(q)
    kv_heads, dim = k.shape[1], k.shape[2]
    group = q.shape[1] // kv_heads
    for start, length in zip(seq_starts.tolist(), seq_lens.tolist()):
        pages = -(-length // page_size)
        keys, values = (t[start : start + length].float() for t in (k, v))  # [L, Hkv, D]
        key = torch.arange(length, device=q.device)
        for first in range(0, length, query_chunk):
            last = min(first + query_chunk, length)
            rows = slice(start + first, start + last)
            page_mask = unpack_page_bits(bits[:, rows], pages)  # [R, Hkv, P]
            read = page_mask.repeat_interleave(page_size, dim=-1)[..., :length]
            position = torch.arange(first, last, device=q.device).view(-1, 1, 1)
            read = read & (key.view(1, 1, -1) <= position)  # [R, Hkv, L]
            qg = q[rows].float().view(last - first, kv_heads, group, dim)
            scores = torch.einsum("rhgd,lhd->rhgl", qg, keys) / math.sqrt(dim)
            read = read.unsqueeze(2)
            # a row reading nothing is 0 with a zero gradient, as in the kernel: its softmax
            # runs over zeros (a softmax over nothing is NaN, and so is its gradient)
            some = read.any(-1, keepdim=True)
            scores = scores.masked_fill(~read & some, float("-inf")).masked_fill(~some, 0.0)
            weights = torch.softmax(scores, dim=-1) * some
            result = torch.einsum("rhgl,lhd->rhgd", weights, values)
            out[rows] = result.reshape(last - first, -1, dim).to(q.dtype)
            if lse is not None:
                log2 = (scores.logsumexp(-1) * LOG2E).masked_fill(~some.squeeze(-1), 0.0)
                lse[rows] = log2.reshape(last - first, -1).detach()
    return out


# launcher


def supported_page_size(page_size: int) -> bool:
    """Page sizes the kernel takes: powers of two from 2 to 128."""
    return 2 <= page_size <= 128 and page_size & (page_size - 1) == 0


def _check(q, k, v, bits, seq_starts, seq_lens, page_size):
    check(
        q.dim() == 3
        and k.dim() == 3
        and k.shape == v.shape
        and q.shape[0] == k.shape[0]
        and q.shape[2] == k.shape[2],
        f"q must be [N, Hq, D] and k, v [N, Hkv, D], got "
        f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}",
    )
    total, heads, dim = q.shape
    kv_heads = k.shape[1]
    check(heads % kv_heads == 0, f"{heads} query heads do not split into {kv_heads} KV heads")
    check(
        q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32),
        f"q, k, v must share a float dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    check(
        supported_page_size(page_size),
        f"page_size must be a power of two in [2, 128], got {page_size}",
    )
    check(
        bits.dim() == 3
        and tuple(bits.shape[:2]) == (kv_heads, total)
        and bits.dtype == torch.int32,
        f"bits must be [{kv_heads}, {total}, words] int32, got {tuple(bits.shape)} {bits.dtype}",
    )
    check(
        seq_starts.dim() == 1 and seq_starts.shape == seq_lens.shape,
        f"seq_starts and seq_lens must be [B], got {tuple(seq_starts.shape)}, "
        f"{tuple(seq_lens.shape)}",
    )
    check_integer("seq_starts", seq_starts)
    check_integer("seq_lens", seq_lens)
    for name, t in (("q", q), ("k", k), ("v", v), ("bits", bits)):
        check_last_dim_contiguous(name, t)
    devices = {t.device for t in (q, k, v, bits, seq_starts, seq_lens)}
    check(len(devices) == 1, f"tensors on several devices: {sorted(map(str, devices))}")


def teacher_sparse_attention(
    q,
    k,
    v,
    bits,
    seq_starts,
    seq_lens,
    page_size: int,
    *,
    max_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    skip_empty: bool = False,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """See the module docstring; into `out` when given (q's shape and dtype), whose rows
    outside every sequence are left as they were. max_len: the longest sequence, when the
    caller knows it (saves a device sync); block_m, block_n, num_warps, num_stages: the
    launch (benchmarks and tests choose them; block_n holds at most 16 pages); skip_empty:
    test each KV tile for a selected page before loading it (False: mask only, which keeps
    the loop free of branches for the compiler's pipelining). The defaults are the fastest
    launch measured (H200, 16 x 8K, 0.86 preset, benchmarks/teacher_forced.py): masking
    only with 3 stages 12.5 ms a layer, against 19.9 ms with the tile test and 2 stages;
    neighbouring queries choose different pages, so few whole tiles can be skipped. lse: a
    float32 [N, Hq] tensor that receives each row's log2-sum-exp2 of its scaled scores (the
    backward's saved statistic, kernels/teacher_attention_backward.py; 0 for a row reading
    nothing, rows outside every sequence left as they were)."""
    _check(q, k, v, bits, seq_starts, seq_lens, page_size)
    if max_len is None:
        max_len = max(seq_lens.tolist(), default=0)
    check(
        bits.shape[2] * WORD >= -(-max_len // page_size),
        f"bits hold {bits.shape[2] * WORD} pages a row, a sequence has {-(-max_len // page_size)}",
    )
    total, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    block_m = block_m or max(64 if q.dtype == torch.float32 else 128, next_power_of_2(group))
    block_n = block_n or max(page_size, min(64, 16 * page_size))
    check(
        block_n % page_size == 0
        and block_n // page_size <= 16
        and block_n >= 16
        and block_m >= max(16, group),
        f"block_n {block_n} must be a multiple of "
        f"page_size {page_size} of at most 16 pages and >= 16, block_m {block_m} >= "
        f"max(16, group {group})",
    )
    if out is None:
        out = torch.empty_like(q)
    check(
        out.shape == q.shape
        and out.dtype == q.dtype
        and out.device == q.device
        and out.stride(-1) == 1,
        f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}",
    )
    if lse is not None:
        check(
            lse.shape == q.shape[:2]
            and lse.dtype == torch.float32
            and lse.is_contiguous()
            and lse.device == q.device,
            f"lse must be float32 [{total}, {heads}] "
            f"contiguous, got {tuple(lse.shape)} {lse.dtype}",
        )
    if not use_kernel(q, k, v, bits, seq_starts, seq_lens):
        out.copy_(
            teacher_attention_reference(q, k, v, bits, seq_starts, seq_lens, page_size, lse=lse)
        )
        return out
    block_q = block_m // group
    batch = seq_lens.shape[0]
    if batch and total and max_len:
        block_d = max(16, next_power_of_2(dim))
        grid = (-(-max_len // block_q), kv_heads, batch)
        _teacher_attention_kernel[grid](
            q,
            k,
            v,
            bits,
            seq_starts,
            seq_lens,
            out,
            out if lse is None else lse,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            bits.stride(0),
            bits.stride(1),
            out.stride(0),
            out.stride(1),
            heads,
            dim,
            LOG2E / math.sqrt(dim),
            GROUP=group,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            PAGE=page_size,
            EVEN_D=dim == block_d,
            IEEE=q.dtype == torch.float32,
            SKIP_EMPTY=bool(skip_empty),
            STORE_LSE=lse is not None,
            num_warps=num_warps or (8 if block_m >= 128 else 4),
            num_stages=num_stages,
        )
    return out
