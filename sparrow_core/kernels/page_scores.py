"""Page scoring for block-sparse decode: q_mean . centroid for every cached page, per KV head.

    scores = page_scores(q, centroids, page_tables, num_tokens)   # [B, Hkv, W] float32

q [B, Hq, D] (the step's post-RoPE queries); centroids one layer [P, Hkv, D] float32 (the mean
key of each full page); page_tables [B, W]; num_tokens [B]. q_mean is the mean of the query
heads of each KV group, in float32 (sparse/selection.py's group_query_mean); score[b, h, i] =
q_mean[b, h] . centroids[page_tables[b, i], h]. Columns at or past a row's page count
ceil(num_tokens / page_size) are -inf. The partial last page's centroid is stale, but it is
a reserved page and never ranked (page_topk.py).

One program per (sequence, KV head, block of pages): the group's queries are averaged in
registers, the block's centroids gathered through the page table (512 contiguous bytes per
page and head). Off GPU the launcher runs the reference, built on sparse/selection.py.
Tests: `python -m pytest tests/sparrow_core/kernels -q`.
"""

from __future__ import annotations

import torch

from sparrow_core.kernels.runtime import (
    check, check_integer, check_last_dim_contiguous, jit, next_power_of_2, tl, use_kernel)
from sparrow_core.sparse.selection import group_query_mean, score_pages


@jit
def _page_scores_kernel(q_ptr, cent_ptr, table_ptr, ntok_ptr, score_ptr,
                        s_qb, s_qh, s_cp, s_ch, s_tb, width, dim,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_P: tl.constexpr, PAGE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    block = tl.program_id(2)
    n_pages = (tl.load(ntok_ptr + b).to(tl.int32) + PAGE - 1) // PAGE
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b * s_qb + (h * GROUP + g)[:, None] * s_qh + d[None, :],
                mask=(g < GROUP)[:, None] & (d < dim)[None, :], other=0.0).to(tl.float32)
    q_mean = tl.sum(q, axis=0) / GROUP
    p = block * BLOCK_P + tl.arange(0, BLOCK_P)
    present = p < n_pages
    phys = tl.load(table_ptr + b * s_tb + p, mask=present, other=0).to(tl.int64)
    cent = tl.load(cent_ptr + phys[:, None] * s_cp + h * s_ch + d[None, :],
                   mask=present[:, None] & (d < dim)[None, :], other=0.0)
    score = tl.sum(cent * q_mean[None, :], axis=1)
    score = tl.where(present, score, float("-inf"))
    row = b * tl.num_programs(1) + h
    tl.store(score_ptr + row * width + p, score, mask=p < width)


def page_scores_reference(q, centroids, page_tables, num_tokens, page_size):
    """The same scores from sparse/selection.py's reference functions."""
    scores = score_pages(group_query_mean(q, centroids.shape[1]), centroids[page_tables.long()])
    n_pages = (num_tokens + page_size - 1) // page_size
    absent = torch.arange(page_tables.shape[1], device=q.device) >= n_pages.view(-1, 1, 1)
    return scores.masked_fill(absent, float("-inf"))


def _check(q, centroids, page_tables, num_tokens) -> None:
    check(q.dim() == 3, f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    check(centroids.dim() == 3, f"centroids must be one layer [P, Hkv, D], got "
          f"{tuple(centroids.shape)}")
    batch, heads, dim = q.shape
    check(centroids.shape[2] == dim, f"centroid dim {centroids.shape[2]} differs from q's {dim}")
    check(heads % centroids.shape[1] == 0,
          f"{heads} query heads do not split into {centroids.shape[1]} KV heads")
    check(centroids.dtype == torch.float32, f"centroids must be float32, got {centroids.dtype}")
    check(page_tables.dim() == 2 and page_tables.shape[0] == batch,
          f"page_tables must be [{batch}, W], got {tuple(page_tables.shape)}")
    check(tuple(num_tokens.shape) == (batch,),
          f"num_tokens must be [{batch}], got {tuple(num_tokens.shape)}")
    check_integer("page_tables", page_tables)
    check_integer("num_tokens", num_tokens)
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("centroids", centroids)


def page_scores(q: torch.Tensor, centroids: torch.Tensor, page_tables: torch.Tensor,
                num_tokens: torch.Tensor, page_size: int, block_pages: int = 64,
                num_warps: int = 4) -> torch.Tensor:
    """Scores [B, Hkv, W] float32; -inf past each row's page count (block_pages and
    num_warps are the launch configuration, swept by benchmarks/attention.py)."""
    _check(q, centroids, page_tables, num_tokens)
    batch, heads, dim = q.shape
    kv_heads, width = centroids.shape[1], page_tables.shape[1]
    if not use_kernel(q, centroids, page_tables, num_tokens):
        return page_scores_reference(q, centroids, page_tables, num_tokens, page_size)
    scores = torch.empty(batch, kv_heads, width, dtype=torch.float32, device=q.device)
    block_p = block_pages
    if batch and width:
        group = heads // kv_heads
        _page_scores_kernel[(batch, kv_heads, -(-width // block_p))](
            q, centroids, page_tables, num_tokens, scores,
            q.stride(0), q.stride(1), centroids.stride(0), centroids.stride(1),
            page_tables.stride(0), width, dim,
            GROUP=group, BLOCK_G=next_power_of_2(group), BLOCK_D=next_power_of_2(dim),
            BLOCK_P=block_p, PAGE=page_size, num_warps=num_warps)
    return scores
