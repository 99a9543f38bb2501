"""Page scoring for block-sparse decode: q_mean . centroid for every cached page, per KV head,
or another rule of sparse/scoring.py (per-head max, Quest bounds).

    scores = page_scores(q, centroids, page_tables, num_tokens)   # [B, Hkv, W] float32
    scores = page_scores(q, centroids, ..., selection="centroid_maxhead")
    scores = page_scores(q, bounds, ..., selection="quest")       # bounds [P, 2, Hkv, D]

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
centroid_maxhead loads each query head in turn instead of their mean and keeps the max of
its products over the group (the same bytes, G times the products); quest and quest_maxhead
read the page's two bound rows (KVCache.bounds, cache dtype) and sum max(q_d kmin_d,
q_d kmax_d) as where(q_d > 0, q_d kmax_d, q_d kmin_d), equal to the reference's two
products up to summation order.
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
from sparrow.sparse.scoring import PageSummary, get_rule
from sparrow.sparse.selection import group_query_mean, score_pages

CENTROID_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)


@jit
def _summary_score(q, low, high, BOUNDS: tl.constexpr):
    """[P, H] scores of a [H, D] query: q . centroid (low is the centroid), or the Quest
    bound sum_d max(q_d low_d, q_d high_d) of the key bounds."""
    if BOUNDS:
        qb = q[None, :, :]
        return tl.sum(tl.where(qb > 0, qb * high, qb * low), axis=2)
    return tl.sum(low * q[None, :, :], axis=2)


@jit
def _query_mean(q_ptr, b, s_qb, s_qh, h, d, hd_mask, GROUP: tl.constexpr, BLOCK_H, BLOCK_D):
    q_sum = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for g in tl.static_range(GROUP):
        rows = h * GROUP + g
        q_sum += tl.load(
            q_ptr + b * s_qb + rows[:, None] * s_qh + d[None, :], mask=hd_mask, other=0.0
        ).to(tl.float32)
    return q_sum / GROUP  # [H, D]


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
    s_cb,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCKS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    MAXHEAD: tl.constexpr = False,
    BOUNDS: tl.constexpr = False,
):
    """Scores of sequence b's pages in blocks first .. first + BLOCKS - 1 for every KV head,
    -inf for the pages past the row's count. cent_ptr: the centroids, or with BOUNDS the key
    bounds [P, 2, Hkv, D] (s_cb the stride from min to max); MAXHEAD scores each query head
    of the group and keeps the max, else the group mean."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hd_mask = (h < kv_heads)[:, None] & (d < dim)[None, :]
    q_mean = _query_mean(q_ptr, b, s_qb, s_qh, h, d, hd_mask, GROUP, BLOCK_H, BLOCK_D)
    for block in tl.range(first, first + BLOCKS, num_stages=NUM_STAGES):
        p = block * BLOCK_P + tl.arange(0, BLOCK_P)
        present = p < n_pages
        phys = tl.load(table_ptr + b * s_tb + p, mask=present, other=0).to(tl.int64)
        # every KV head of a page at once: one contiguous centroid row per page
        offs = phys[:, None, None] * s_cp + h[None, :, None] * s_ch + d[None, None, :]
        load_mask = present[:, None, None] & hd_mask[None, :, :]
        cent = tl.load(cent_ptr + offs, mask=load_mask, other=0.0).to(tl.float32)
        high = cent
        if BOUNDS:  # the max row follows the min row of the same page
            high = tl.load(cent_ptr + offs + s_cb, mask=load_mask, other=0.0).to(tl.float32)
        if MAXHEAD:
            score = tl.full([BLOCK_P, BLOCK_H], float("-inf"), tl.float32)
            for g in tl.static_range(GROUP):
                q_head = tl.load(
                    q_ptr + b * s_qb + (h * GROUP + g)[:, None] * s_qh + d[None, :],
                    mask=hd_mask,
                    other=0.0,
                ).to(tl.float32)
                score = tl.maximum(score, _summary_score(q_head, cent, high, BOUNDS))
        else:
            score = _summary_score(q_mean, cent, high, BOUNDS)  # [P, H]
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
    s_cb,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
    MAXHEAD: tl.constexpr,
    BOUNDS: tl.constexpr,
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
        s_cb,
        GROUP,
        BLOCK_H,
        BLOCK_D,
        BLOCK_P,
        BLOCKS_PER_PROGRAM,
        NUM_STAGES,
        MAXHEAD,
        BOUNDS,
    )
    if PDL:  # the next kernel may launch once every program has scored its pages
        gdc_launch_dependents()


def page_scores_reference(q, centroids, page_tables, num_tokens, page_size, selection="centroid"):
    """The same scores from sparse/selection.py's and sparse/scoring.py's references."""
    if selection == "centroid":
        pages = centroids[page_tables.long()]
        scores = score_pages(group_query_mean(q, centroids.shape[1]), pages)
    else:
        rule = get_rule(selection)
        gathered = centroids[page_tables.long()]
        summary = PageSummary(bounds=gathered) if rule.bounds else PageSummary(centroids=gathered)
        scores = rule.score(q, summary)
    n_pages = (num_tokens + page_size - 1) // page_size
    absent = torch.arange(page_tables.shape[1], device=q.device) >= n_pages.view(-1, 1, 1)
    return scores.masked_fill(absent, float("-inf"))


def check_score_inputs(q, centroids, page_tables, num_tokens, selection="centroid") -> None:
    rule = get_rule(selection)
    check(rule.decodes, f"page-scoring rule {selection!r} cannot decode (replay only)")
    check(q.dim() == 3, f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    if rule.bounds:
        check(
            centroids.dim() == 4 and centroids.shape[1] == 2,
            f"rule {selection!r} takes one layer's key bounds [P, 2, Hkv, D], got "
            f"{tuple(centroids.shape)}",
        )
        centroids = centroids[:, 0]
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
    block_pages: int | None = None,
    num_warps: int = 4,
    blocks_per_program: int = 1,
    num_stages: int = 1,
    selection: str = "centroid",
) -> torch.Tensor:
    """Scores [B, Hkv, W] float32; -inf past each row's page count. selection: the rule
    (sparse/scoring.py); a bounds rule takes the key bounds [P, 2, Hkv, D] for centroids.
    block_pages (pages per loop iteration; None: 16, 8 for a bounds rule, which holds two
    vectors a page in registers), blocks_per_program, num_warps and num_stages are the
    launch configuration, swept by benchmarks/sparse_stage.py."""
    check_score_inputs(q, centroids, page_tables, num_tokens, selection)
    rule = get_rule(selection)
    batch, heads, dim = q.shape
    kv_heads, width = centroids.shape[-2], page_tables.shape[1]
    if not use_kernel(q, centroids, page_tables, num_tokens):
        return page_scores_reference(q, centroids, page_tables, num_tokens, page_size, selection)
    block_pages = block_pages or (8 if rule.bounds else 16)
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
            centroids.stride(-2),
            page_tables.stride(0),
            width,
            dim,
            kv_heads,
            centroids.stride(1) if rule.bounds else 0,
            GROUP=group,
            BLOCK_H=next_power_of_2(kv_heads),
            BLOCK_D=next_power_of_2(dim),
            BLOCK_P=block_pages,
            PAGE=page_size,
            BLOCKS_PER_PROGRAM=blocks_per_program,
            NUM_STAGES=num_stages,
            PDL=pdl,
            MAXHEAD=rule.per_head,
            BOUNDS=rule.bounds,
            num_warps=num_warps,
            launch_pdl=pdl,
        )
    return scores
