"""Paged decode attention, split-K and GQA-aware: dense over every cached page, or
block-sparse over per-KV-head page lists.

    out = paged_decode_attention(q, k_pages, v_pages, page_tables, num_tokens)
    out = sparse_paged_decode_attention(q, k_pages, v_pages, page_tables, num_tokens,
                                        page_lists, page_counts)

q [B, Hq, D]; k_pages, v_pages one layer of the cache [P, Hkv, page_size, D] (head-major: a
KV head's page is contiguous, page_size * D elements); page_tables
[B, W] physical page ids; num_tokens [B] cached tokens (current one included; 0 gives a zero
row, for padded batches); page_lists [B, Hkv, L] logical page indices (positions i*ps ..
i*ps+ps-1 of the sequence), the first page_counts [B, Hkv] of them read. Out [B, Hq, D] in
q's dtype: exact softmax (scale 1/sqrt(D), float32 accumulation) over the tokens read.

One program per (sequence, KV head, split) loads each page of its split once for all the
query heads of the group (a [G, D] x [D, N] product on the tensor cores, G padded to 16) and
keeps an online softmax; the splits cut the pages present at run time (num_tokens, counts),
so a CUDA graph captured at one width serves every length. split_combine.py merges them in a
second launch: merging them in the attention kernel itself (the last split to finish merges)
saves that launch but measured slower on an H100, in the sparse stage and in dense decode.
Off GPU (and without TRITON_INTERPRET) the launchers run the PyTorch references below.
Tests: `python -m pytest tests/kernels -q`.
"""

from __future__ import annotations

import math

import torch

from sparrow.kernels.runtime import (
    check,
    check_integer,
    check_last_dim_contiguous,
    check_page_tables,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    multiprocessors,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)
from sparrow.kernels.split_combine import combine_splits

LOG2E = 1.4426950408889634


@jit
def _block_ids(
    blk,
    tok,
    n_entries,
    list_row_ptr,
    table_row_ptr,
    PAGE: tl.constexpr,
    PAGES_PER_BLOCK: tl.constexpr,
    SPARSE: tl.constexpr,
):
    """Logical and physical page of each token slot of block blk (entries past the list's
    end read nothing and give page 0)."""
    entry = blk * PAGES_PER_BLOCK + tok // PAGE
    in_list = entry < n_entries
    if SPARSE:
        logical = tl.load(list_row_ptr + entry, mask=in_list, other=0)
    else:
        logical = entry
    phys = tl.load(table_row_ptr + logical, mask=in_list, other=0).to(tl.int64)
    return logical, phys


@jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    ntok_ptr,
    list_ptr,
    count_ptr,
    part_o_ptr,
    part_lse_ptr,
    s_qb,
    s_qh,
    s_kp,
    s_kt,
    s_kh,
    s_tb,
    s_lb,
    s_lh,
    s_cb,
    dim,
    qk_scale,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    PAGES_PER_BLOCK: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPARSE: tl.constexpr,
    IEEE: tl.constexpr,
    EVEN_D: tl.constexpr,
    PREFETCH_IDS: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # see runtime.py: wait for the kernel before
        gdc_wait()
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    BLOCK_N: tl.constexpr = PAGE * PAGES_PER_BLOCK
    n_tok = tl.load(ntok_ptr + b).to(tl.int32)
    if SPARSE:
        n_entries = tl.load(count_ptr + b * s_cb + h).to(tl.int32)
    else:
        n_entries = (n_tok + PAGE - 1) // PAGE
    n_blocks = (n_entries + PAGES_PER_BLOCK - 1) // PAGES_PER_BLOCK
    per_split = (n_blocks + NUM_SPLITS - 1) // NUM_SPLITS
    blk_start = split * per_split
    blk_end = tl.minimum(blk_start + per_split, n_blocks)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    tok = tl.arange(0, BLOCK_N)
    head = h * GROUP + g
    # with the head dim a power of two the masks stay per row, so loads vectorise
    d_ok = (d < BLOCK_D) if EVEN_D else (d < dim)
    q = tl.load(
        q_ptr + b * s_qb + head[:, None] * s_qh + d[None, :],
        mask=(g < GROUP)[:, None] & d_ok[None, :],
        other=0.0,
    )
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    list_row = list_ptr + b * s_lb + h * s_lh
    table_row = table_ptr + b * s_tb
    if PREFETCH_IDS:  # the ids of the next block load while this block's K/V stream in
        logical_next, phys_next = _block_ids(
            blk_start, tok, n_entries, list_row, table_row, PAGE, PAGES_PER_BLOCK, SPARSE
        )
    for blk in range(blk_start, blk_end):
        entry = blk * PAGES_PER_BLOCK + tok // PAGE
        in_list = entry < n_entries
        if PREFETCH_IDS:
            logical = logical_next
            phys = phys_next
            logical_next, phys_next = _block_ids(
                blk + 1, tok, n_entries, list_row, table_row, PAGE, PAGES_PER_BLOCK, SPARSE
            )
        else:
            logical, phys = _block_ids(
                blk, tok, n_entries, list_row, table_row, PAGE, PAGES_PER_BLOCK, SPARSE
            )
        pos = logical * PAGE + tok % PAGE
        valid = in_list & (pos < n_tok)
        offs = phys * s_kp + (tok % PAGE) * s_kt + h * s_kh
        if EVEN_D:
            kv_mask = valid[:, None]
        else:
            kv_mask = valid[:, None] & (d < dim)[None, :]
        keys = tl.load(k_ptr + offs[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(keys), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(keys))
        qk = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, axis=1))
        # a block with no readable token (a listed page past num_tokens) keeps m at -inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        values = tl.load(v_ptr + offs[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p, values, input_precision="ieee")
        else:
            pv = tl.dot(p.to(values.dtype), values)
        acc = acc * alpha[:, None] + pv
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        m = m_new
    if PDL:  # the next kernel may launch once every program has left its loop
        gdc_launch_dependents()
    # an empty split (or a row with no tokens) reports lse = -inf and a zero output
    has = l_sum > 0
    out = acc / tl.where(has, l_sum, 1.0)[:, None]
    pair = b * tl.num_programs(1) + h  # the (sequence, KV head) of this program
    out_row = pair * GROUP + g  # b * Hq + query head
    out_mask = (g < GROUP)[:, None] & d_ok[None, :]
    lse = tl.where(has, m + tl.log2(tl.where(has, l_sum, 1.0)), float("-inf"))
    row = out_row * NUM_SPLITS + split
    tl.store(part_lse_ptr + row, lse, mask=g < GROUP)
    tl.store(part_o_ptr + row[:, None] * dim + d[None, :], out, mask=out_mask)


# references


def _gather_attention(q, k_pages, v_pages, page_tables, num_tokens, page_mask):
    """Exact attention over the tokens of the pages marked in page_mask [B, Hkv, W]."""
    batch, width = page_tables.shape
    kv_heads, page_size, dim = k_pages.shape[1:]
    group = q.shape[1] // kv_heads
    # [B, W, Hkv, page_size, D] -> [B, W * page_size, Hkv, D]
    keys = (
        k_pages[page_tables.long()].transpose(2, 3).reshape(batch, width * page_size, kv_heads, dim)
    )
    values = (
        v_pages[page_tables.long()].transpose(2, 3).reshape(batch, width * page_size, kv_heads, dim)
    )
    slot = torch.arange(width * page_size, device=q.device)
    read = page_mask.repeat_interleave(page_size, dim=-1)
    read = read & (slot < num_tokens.view(batch, 1, 1))  # [B, Hkv, K]
    qg = q.float().view(batch, kv_heads, group, dim)
    scores = torch.einsum("bhgd,bkhd->bhgk", qg, keys.float()) / math.sqrt(dim)
    scores = scores.masked_fill(~read.unsqueeze(2), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: zeros
    out = torch.einsum("bhgk,bkhd->bhgd", weights, values.float())
    return out.reshape(batch, kv_heads * group, dim).to(q.dtype)


def paged_decode_reference(q, k_pages, v_pages, page_tables, num_tokens):
    batch, width = page_tables.shape
    every = torch.ones(batch, k_pages.shape[1], width, dtype=torch.bool, device=q.device)
    return _gather_attention(q, k_pages, v_pages, page_tables, num_tokens, every)


def sparse_paged_decode_reference(
    q, k_pages, v_pages, page_tables, num_tokens, page_lists, page_counts
):
    batch, width = page_tables.shape
    entry = torch.arange(page_lists.shape[-1], device=q.device)
    listed = entry < page_counts.unsqueeze(-1)  # [B, Hkv, L]
    mask = torch.zeros(batch, k_pages.shape[1], width + 1, dtype=torch.bool, device=q.device)
    index = torch.where(listed, page_lists.long(), width)  # unlisted entries land in column W
    mask.scatter_(-1, index, True)
    return _gather_attention(q, k_pages, v_pages, page_tables, num_tokens, mask[..., :width])


# launchers


def _check(q, k_pages, v_pages, page_tables, num_tokens) -> None:
    check(q.dim() == 3, f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    check(
        k_pages.dim() == 4 and k_pages.shape == v_pages.shape,
        f"k_pages and v_pages must share a shape [P, Hkv, page_size, D], got "
        f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}",
    )
    check(k_pages.stride() == v_pages.stride(), "k_pages and v_pages must share strides")
    batch, heads, dim = q.shape
    kv_heads = k_pages.shape[1]
    check(k_pages.shape[3] == dim, f"q head dim {dim} differs from the cache's {k_pages.shape[3]}")
    check(heads % kv_heads == 0, f"{heads} query heads do not split into {kv_heads} KV heads")
    check(
        q.dtype == k_pages.dtype == v_pages.dtype
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32),
        f"q, k_pages, v_pages must share a float dtype, got {q.dtype}, {k_pages.dtype}",
    )
    check_page_tables(page_tables, num_tokens, batch)
    for name, t in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        check_last_dim_contiguous(name, t)
    devices = {t.device for t in (q, k_pages, v_pages, page_tables, num_tokens)}
    check(len(devices) == 1, f"tensors on several devices: {sorted(map(str, devices))}")


def choose_splits(
    batch: int, kv_heads: int, max_entries: int, pages_per_block: int, device: torch.device
) -> int:
    """Splits per (sequence, KV head): enough programs to fill the GPU about four times,
    each split keeping at least two blocks of pages at the widest row."""
    programs = max(1, batch * kv_heads)
    wanted = next_power_of_2(-(-4 * multiprocessors(device) // programs))
    blocks = -(-max(1, max_entries) // pages_per_block)
    return max(1, min(wanted, 64, blocks // 2 or 1))


def _launch(
    q,
    k_pages,
    v_pages,
    page_tables,
    num_tokens,
    page_lists,
    page_counts,
    num_splits,
    pages_per_block,
    num_warps=4,
    num_stages=2,
    prefetch_ids=False,
):
    batch, heads, dim = q.shape
    kv_heads, page_size = k_pages.shape[1], k_pages.shape[2]
    group = heads // kv_heads
    sparse = page_lists is not None
    entries = page_lists.shape[-1] if sparse else page_tables.shape[1]
    if pages_per_block is None:
        pages_per_block = max(1, 64 // page_size)
    if num_splits is None:
        num_splits = choose_splits(batch, kv_heads, entries, pages_per_block, q.device)
    if batch == 0:
        return torch.empty_like(q)
    part_o = torch.empty(batch, heads, num_splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    lists = page_lists if sparse else page_tables  # any int tensor; unused when dense
    counts = page_counts if sparse else num_tokens
    pdl = pdl_launch(q.device)
    _paged_decode_kernel[(batch, kv_heads, num_splits)](
        q,
        k_pages,
        v_pages,
        page_tables,
        num_tokens,
        lists,
        counts,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        k_pages.stride(0),
        k_pages.stride(2),
        k_pages.stride(1),
        page_tables.stride(0),
        lists.stride(0) if sparse else 1,
        lists.stride(1) if sparse else 1,
        counts.stride(0) if sparse else 1,
        dim,
        LOG2E / math.sqrt(dim),
        GROUP=group,
        BLOCK_G=max(16, next_power_of_2(group)),
        BLOCK_D=max(16, next_power_of_2(dim)),
        PAGE=page_size,
        PAGES_PER_BLOCK=pages_per_block,
        NUM_SPLITS=num_splits,
        SPARSE=sparse,
        IEEE=q.dtype == torch.float32,
        EVEN_D=dim == max(16, next_power_of_2(dim)),
        PREFETCH_IDS=bool(prefetch_ids),
        PDL=pdl,
        num_warps=num_warps,
        num_stages=num_stages,
        launch_pdl=pdl,
    )
    return combine_splits(part_o, part_lse, q.dtype)


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    page_tables,
    num_tokens,
    *,
    num_splits: int | None = None,
    pages_per_block: int | None = None,
    **tuning: int,
) -> torch.Tensor:
    """Dense decode: each sequence's query over all its cached tokens ([B, Hq, D]).

    num_splits, pages_per_block and tuning (num_warps, num_stages, prefetch_ids: load the
    next block's page ids one iteration ahead) override the launch
    configuration (benchmarks sweep them); the defaults are the measured best. A second
    kernel, combine_splits, merges the splits."""
    _check(q, k_pages, v_pages, page_tables, num_tokens)
    if not use_kernel(q, k_pages, page_tables, num_tokens):
        return paged_decode_reference(q, k_pages, v_pages, page_tables, num_tokens)
    return _launch(
        q,
        k_pages,
        v_pages,
        page_tables,
        num_tokens,
        None,
        None,
        num_splits,
        pages_per_block,
        **tuning,
    )


def sparse_paged_decode_attention(
    q,
    k_pages,
    v_pages,
    page_tables,
    num_tokens,
    page_lists,
    page_counts,
    *,
    num_splits: int | None = None,
    pages_per_block: int | None = None,
    **tuning: int,
) -> torch.Tensor:
    """Block-sparse decode: per KV head, only the listed logical pages are read (num_splits,
    pages_per_block and tuning as for paged_decode_attention)."""
    _check(q, k_pages, v_pages, page_tables, num_tokens)
    batch, kv_heads = q.shape[0], k_pages.shape[1]
    check(
        page_lists.dim() == 3 and tuple(page_lists.shape[:2]) == (batch, kv_heads),
        f"page_lists must be [{batch}, {kv_heads}, L], got {tuple(page_lists.shape)}",
    )
    check(
        tuple(page_counts.shape) == (batch, kv_heads),
        f"page_counts must be [{batch}, {kv_heads}], got {tuple(page_counts.shape)}",
    )
    check_integer("page_lists", page_lists)
    check_integer("page_counts", page_counts)
    check(
        page_lists.stride(-1) == 1 and page_counts.stride(-1) == 1,
        "page_lists and page_counts must be contiguous in their last dimension",
    )
    if not use_kernel(q, k_pages, page_tables, num_tokens, page_lists, page_counts):
        return sparse_paged_decode_reference(
            q, k_pages, v_pages, page_tables, num_tokens, page_lists, page_counts
        )
    return _launch(
        q,
        k_pages,
        v_pages,
        page_tables,
        num_tokens,
        page_lists,
        page_counts,
        num_splits,
        pages_per_block,
        **tuning,
    )
