"""Page scoring for block-sparse decode: q_mean . centroid for every cached page, per KV head.

    scores = page_scores(q, centroids, page_tables, num_tokens)   # [B, Hkv, W] float32

q [B, Hq, D] (the step's post-RoPE queries); centroids one layer [P, Hkv, D] float32, bf16,
fp16 or float8_e4m3fn (the mean key of each full page, in the cache dtype or, with
EngineConfig.centroid_dtype, in float8: half the bytes this bandwidth-bound kernel reads;
upcast to float32 on load, products summed in float32); page_tables [B, W]; num_tokens [B].
q_mean is the mean of the query heads of each KV group, in float32 (sparse/selection.py's
group_query_mean); score[b, h, i] = q_mean[b, h] . centroids[page_tables[b, i], h]. Columns
at or past a row's page count ceil(num_tokens / page_size) are -inf. The partial last page's
centroid is stale, but it is a reserved page and never ranked (page_topk.py).

One program per (sequence, run of blocks_per_program blocks of pages) and all KV heads: the
group means of the queries in registers, then each page's centroids of every head, one contiguous row of Hkv x D
values (2 KB in bf16 at 8 x 128), gathered through the page table; reading whole rows rather than
one head's 512 bytes per program keeps the DRAM accesses long. Off GPU the launcher runs the reference, built on sparse/selection.py.
Tests: `python -m pytest tests/kernels -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.runtime import (
    check,
    check_last_dim_contiguous,
    check_page_tables,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)
from sparrow.sparse.selection import group_query_mean, score_pages

CENTROID_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)


@jit
def _score_blocks(
    q_ptr,
    cent_ptr,
    table_ptr,
    score_ptr,
    b,
    n_pages,
    first,
    s_qb,
    s_qh,
    s_cp,
    s_ch,
    s_tb,
    width,
    dim,
    kv_heads,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCKS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Scores of sequence b's pages in blocks first .. first + BLOCKS - 1 for every KV head,
    -inf for the pages past the row's count."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hd_mask = (h < kv_heads)[:, None] & (d < dim)[None, :]
    q_sum = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for g in tl.static_range(GROUP):
        rows = h * GROUP + g
        q_sum += tl.load(
            q_ptr + b * s_qb + rows[:, None] * s_qh + d[None, :], mask=hd_mask, other=0.0
        ).to(tl.float32)
    q_mean = q_sum / GROUP  # [H, D]
    for block in tl.range(first, first + BLOCKS, num_stages=NUM_STAGES):
        p = block * BLOCK_P + tl.arange(0, BLOCK_P)
        present = p < n_pages
        phys = tl.load(table_ptr + b * s_tb + p, mask=present, other=0).to(tl.int64)
        # every KV head of a page at once: one contiguous centroid row per page
        offs = phys[:, None, None] * s_cp + h[None, :, None] * s_ch + d[None, None, :]
        cent = tl.load(
            cent_ptr + offs, mask=present[:, None, None] & hd_mask[None, :, :], other=0.0
        ).to(tl.float32)
        score = tl.sum(cent * q_mean[None, :, :], axis=2)  # [P, H]
        score = tl.where(present[:, None], score, float("-inf"))
        dest = (b * kv_heads + h[None, :]) * width + p[:, None]
        tl.store(score_ptr + dest, score, mask=(p < width)[:, None] & (h < kv_heads)[None, :])


@jit
def _page_scores_kernel(
    q_ptr,
    cent_ptr,
    table_ptr,
    ntok_ptr,
    score_ptr,
    s_qb,
    s_qh,
    s_cp,
    s_ch,
    s_tb,
    width,
    dim,
    kv_heads,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # see runtime.py: wait for the kernel before
        gdc_wait()
    b = tl.program_id(0)
    n_pages = (tl.load(ntok_ptr + b).to(tl.int32) + PAGE - 1) // PAGE
    # pages past the row's count load nothing and score -inf
    _score_blocks(
        q_ptr,
        cent_ptr,
        table_ptr,
        score_ptr,
        b,
        n_pages,
        tl.program_id(1) * BLOCKS_PER_PROGRAM,
        s_qb,
        s_qh,
        s_cp,
        s_ch,
        s_tb,
        width,
        dim,
        kv_heads,
        GROUP,
        BLOCK_H,
        BLOCK_D,
        BLOCK_P,
        BLOCKS_PER_PROGRAM,
        NUM_STAGES,
    )
    if PDL:  # the next kernel may launch once every program has scored its pages
        gdc_launch_dependents()


def page_scores_reference(q, centroids, page_tables, num_tokens, page_size):
    """The same scores from sparse/selection.py's reference functions."""
    scores = score_pages(group_query_mean(q, centroids.shape[1]), centroids[page_tables.long()])
    n_pages = (num_tokens + page_size - 1) // page_size
    absent = torch.arange(page_tables.shape[1], device=q.device) >= n_pages.view(-1, 1, 1)
    return scores.masked_fill(absent, float("-inf"))


def check_score_inputs(q, centroids, page_tables, num_tokens) -> None:
    check(q.dim() == 3, f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    check(
        centroids.dim() == 3,
        f"centroids must be one layer [P, Hkv, D], got {tuple(centroids.shape)}",
    )
    batch, heads, dim = q.shape
    check(centroids.shape[2] == dim, f"centroid dim {centroids.shape[2]} differs from q's {dim}")
    check(
        heads % centroids.shape[1] == 0,
        f"{heads} query heads do not split into {centroids.shape[1]} KV heads",
    )
    check(
        centroids.dtype in CENTROID_DTYPES,
        f"centroids must be float32, bfloat16, float16 or float8_e4m3fn, got {centroids.dtype}",
    )
    check_page_tables(page_tables, num_tokens, batch)
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("centroids", centroids)


def page_scores(
    q: torch.Tensor,
    centroids: torch.Tensor,
    page_tables: torch.Tensor,
    num_tokens: torch.Tensor,
    page_size: int,
    block_pages: int = 16,
    num_warps: int = 4,
    blocks_per_program: int = 1,
    num_stages: int = 1,
) -> torch.Tensor:
    """Scores [B, Hkv, W] float32; -inf past each row's page count. block_pages (pages per
    loop iteration), blocks_per_program, num_warps and num_stages are the launch
    configuration, swept by benchmarks/sparse_stage.py."""
    check_score_inputs(q, centroids, page_tables, num_tokens)
    batch, heads, dim = q.shape
    kv_heads, width = centroids.shape[1], page_tables.shape[1]
    if not use_kernel(q, centroids, page_tables, num_tokens):
        return page_scores_reference(q, centroids, page_tables, num_tokens, page_size)
    scores = torch.empty(batch, kv_heads, width, dtype=torch.float32, device=q.device)
    if batch and width:
        group = heads // kv_heads
        blocks = -(-width // block_pages)
        pdl = pdl_launch(q.device)
        _page_scores_kernel[(batch, -(-blocks // blocks_per_program))](
            q,
            centroids,
            page_tables,
            num_tokens,
            scores,
            q.stride(0),
            q.stride(1),
            centroids.stride(0),
            centroids.stride(1),
            page_tables.stride(0),
            width,
            dim,
            kv_heads,
            GROUP=group,
            BLOCK_H=next_power_of_2(kv_heads),
            BLOCK_D=next_power_of_2(dim),
            BLOCK_P=block_pages,
            PAGE=page_size,
            BLOCKS_PER_PROGRAM=blocks_per_program,
            NUM_STAGES=num_stages,
            PDL=pdl,
            num_warps=num_warps,
            launch_pdl=pdl,
        )
    return scores
