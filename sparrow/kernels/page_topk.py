"""Top-k page selection with reserved pages, per (sequence, KV head): scores to page lists.

    lists, counts, mask = page_topk(scores, num_tokens, topk, page_size, reserved_bos=1,
                                    reserved_eos=2, want_mask=True)
    lists, counts, _ = select_page_lists(q, centroids, page_tables, num_tokens, topk,
                                         page_size, reserved_bos, reserved_eos)
    # centroids as page_scores takes them: float32, bf16, fp16 or float8_e4m3fn

The rule of sparse/selection.py (the reference this must equal exactly): of a row's n pages,
0..reserved_bos-1 and the last reserved_eos are always read; the pages between are
eligible and the top-k of them by score are read, ties to the lower page; with no more than k
eligible pages every page is read. Out: lists [B, Hkv, W] int32 holding, in ascending order,
the logical pages read (the first counts [B, Hkv] entries are meaningful), and optionally the
[B, Hkv, W] bool mask.

One program per row keeps the row's scores in registers and finds its top k by narrowing a
set of candidates with one 2^radix_bits-bin histogram per pass (topk_search.py; no sort),
by digits of 32-bit keys ordered as the scores: up to 8 passes of 16 bins by default, which
measured faster on an H200 than 4 passes of 256 bins (11.0 against 13.0 us at batch 16,
2,048 pages). Exact for any scores free of NaN whose eligible entries are not -inf (see
topk_search.py). Tied candidates at the cut are taken in page order, and a prefix sum
compacts the chosen pages into the list; counts come from the row's bounds, not a sum.
Tests: `python -m pytest tests/kernels -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.page_scores import page_scores
from sparrow.kernels.runtime import (
    check,
    check_integer,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)
from sparrow.kernels.topk_search import _topk_search
from sparrow.sparse.selection import select_from_scores


@jit
def _topk_row(
    score_row,
    n_pages,
    k,
    list_row,
    count_at,
    mask_row,
    width,
    BOS: tl.constexpr,
    EOS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WRITE_MASK: tl.constexpr,
    RADIX: tl.constexpr,
):
    """One row's selection (see the module docstring) from its scores at score_row."""
    p = tl.arange(0, BLOCK_W)
    present = p < n_pages
    eligible = (p >= BOS) & (p < n_pages - EOS)
    # entries past the row's page count are never ranked: they need not hold scores
    score = tl.load(score_row + p, mask=present & (p < width), other=0.0)
    score = tl.where(score == 0.0, 0.0, score)  # -0.0 ties with 0.0, as in a float compare
    # counts from the bounds, not from reductions: every reduction is a round of barriers
    n_present = tl.minimum(n_pages, BLOCK_W)
    n_eligible = tl.maximum(tl.minimum(n_pages - EOS, BLOCK_W) - BOS, 0)
    taken, candidate, room, n_candidates = _topk_search(score, eligible, n_eligible, k, RADIX)
    if n_candidates > room:  # tied candidates at the cut: the lower pages first
        candidate = candidate & (tl.cumsum(candidate.to(tl.int32), axis=0) <= room)
    selected = present & ((eligible == 0) | taken | candidate)
    slot = tl.cumsum(selected.to(tl.int32), axis=0) - 1
    tl.store(list_row + slot, p, mask=selected)
    # the search takes exactly min(k, n_eligible) eligible pages
    tl.store(count_at, n_present - n_eligible + tl.minimum(tl.maximum(k, 0), n_eligible))
    if WRITE_MASK:
        tl.store(mask_row + p, selected.to(tl.int8), mask=p < width)


@jit
def _page_topk_kernel(
    score_ptr,
    ntok_ptr,
    topk_ptr,
    list_ptr,
    count_ptr,
    mask_ptr,
    width,
    PAGE: tl.constexpr,
    BOS: tl.constexpr,
    EOS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WRITE_MASK: tl.constexpr,
    RADIX: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # see runtime.py: wait for the kernel before
        gdc_wait()
    b = tl.program_id(0)
    row = b * tl.num_programs(1) + tl.program_id(1)
    n_pages = (tl.load(ntok_ptr + b).to(tl.int32) + PAGE - 1) // PAGE
    k = tl.load(topk_ptr + b).to(tl.int32)
    _topk_row(
        score_ptr + row * width,
        n_pages,
        k,
        list_ptr + row * width,
        count_ptr + row,
        mask_ptr + row * width,
        width,
        BOS,
        EOS,
        BLOCK_W,
        WRITE_MASK,
        RADIX,
    )
    if PDL:  # let the next kernel launch (its programs place as these leave)
        gdc_launch_dependents()


def read_every_page_lists(lists, counts, num_tokens, page_size, kv_heads):
    """lists, counts with the listed KV heads reading every present page (a schedule's
    dense_heads of one layer): torch ops on device tensors, so a CUDA graph captures them."""
    if not kv_heads:
        return lists, counts
    width = lists.shape[-1]
    every = torch.arange(width, dtype=lists.dtype, device=lists.device).expand(lists.shape[0], -1)
    n_pages = ((num_tokens + page_size - 1) // page_size).to(counts.dtype)
    for head in kv_heads:
        lists[:, head] = every
        counts[:, head] = n_pages
    return lists, counts


def lists_from_mask(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Hkv, W] bool -> (lists [B, Hkv, W] int32 ascending, counts [B, Hkv] int32)."""
    width = mask.shape[-1]
    # a stable sort of "not selected" puts the selected pages first, in page order
    order = torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices
    counts = mask.sum(dim=-1, dtype=torch.int32)
    entry = torch.arange(width, device=mask.device)
    lists = torch.where(entry < counts.unsqueeze(-1), order, 0).to(torch.int32)
    return lists, counts


def page_topk_reference(scores, num_tokens, topk, page_size, reserved_bos, reserved_eos):
    n_pages = (num_tokens + page_size - 1) // page_size
    mask = select_from_scores(scores, n_pages, topk, reserved_bos, reserved_eos)
    return (*lists_from_mask(mask), mask)


def page_topk(
    scores: torch.Tensor,
    num_tokens: torch.Tensor,
    topk: torch.Tensor,
    page_size: int,
    reserved_bos: int,
    reserved_eos: int,
    want_mask: bool = False,
    radix_bits: int = 4,
    num_warps: int | None = None,
):
    """Selected page lists from scores [B, Hkv, W] (see the module docstring); radix_bits
    (1, 2, 4 or 8) is the bits per digit and the bins per pass (2^radix_bits), num_warps the
    launch (benchmarks compare them; None picks by row width)."""
    check(
        scores.dim() == 3 and scores.dtype == torch.float32,
        f"scores must be [B, Hkv, W] float32, got {tuple(scores.shape)} {scores.dtype}",
    )
    batch, kv_heads, width = scores.shape
    _check_topk_args(batch, num_tokens, topk, reserved_bos, reserved_eos)
    check(radix_bits in (1, 2, 4, 8), f"radix_bits must be 1, 2, 4 or 8, got {radix_bits}")
    if not use_kernel(scores, num_tokens, topk):
        lists, counts, mask = page_topk_reference(
            scores, num_tokens, topk, page_size, reserved_bos, reserved_eos
        )
        return lists, counts, mask if want_mask else None
    scores = scores.contiguous()
    # entries past a row's count are never read: no need to clear them
    lists = torch.empty(batch, kv_heads, width, dtype=torch.int32, device=scores.device)
    counts = torch.empty(batch, kv_heads, dtype=torch.int32, device=scores.device)
    mask = (
        torch.empty(batch, kv_heads, width, dtype=torch.int8, device=scores.device)
        if want_mask
        else counts
    )
    if batch * kv_heads and width:
        block_w = next_power_of_2(width)
        pdl = pdl_launch(scores.device)
        if num_warps is None:
            num_warps = 4 if block_w <= 1024 else 8 if block_w <= 4096 else 16
        _page_topk_kernel[(batch, kv_heads)](
            scores,
            num_tokens,
            topk,
            lists,
            counts,
            mask,
            width,
            PAGE=page_size,
            BOS=reserved_bos,
            EOS=reserved_eos,
            BLOCK_W=block_w,
            WRITE_MASK=want_mask,
            RADIX=radix_bits,
            PDL=pdl,
            num_warps=num_warps,
            launch_pdl=pdl,
        )
    return lists, counts, mask.bool() if want_mask else None


def _check_topk_args(batch, num_tokens, topk, reserved_bos, reserved_eos) -> None:
    check(
        tuple(num_tokens.shape) == (batch,) and tuple(topk.shape) == (batch,),
        f"num_tokens and topk must be [{batch}], got {tuple(num_tokens.shape)}, "
        f"{tuple(topk.shape)}",
    )
    check_integer("num_tokens", num_tokens)
    check_integer("topk", topk)
    check(
        reserved_bos >= 0 and reserved_eos >= 1,
        f"need reserved_bos >= 0 and reserved_eos >= 1, got {reserved_bos}, {reserved_eos}",
    )


def select_page_lists(
    q,
    centroids,
    page_tables,
    num_tokens,
    topk,
    page_size: int,
    reserved_bos: int,
    reserved_eos: int,
    want_mask: bool = False,
    selection: str = "centroid",
):
    """Scoring and selection: lists, counts and optionally the mask, as page_scores then
    page_topk; selection: the scoring rule (a bounds rule takes the key bounds)."""
    scores = page_scores(q, centroids, page_tables, num_tokens, page_size, selection=selection)
    return page_topk(scores, num_tokens, topk, page_size, reserved_bos, reserved_eos, want_mask)
