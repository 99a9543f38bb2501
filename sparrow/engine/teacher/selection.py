"""Page selection of a teacher-forced sequence, one chunk of query positions at a time.

    for first, last, pages in select_chunks(q, k, prompt_len, schedule, "cache", rows=1024):
        pages   # [last - first, Hkv, n] bool: the pages positions first..last-1 read,
                # n = pages present at position last - 1 (columns past a row's own count are False)

The rule is sparse/selection.py's select_from_scores, the decode step's, applied to every
position t as the step that fed it: n = t // page_size + 1 pages present, scored by the
schedule's rule (sparse/scoring.py) over what the decode's cache holds of the full pages
(centroids rounded to the engine's centroid dtype, or key bounds; the oracle reads the keys
themselves: replay only), top-k of its length bin, reserved_bos / reserved_eos pages always
read, the layer's dense_heads every page; prompt positions read every page (prefill is dense). Scores are held for one chunk only ([rows, Hkv, n] float32), so a
32K sequence never holds its [T, Hkv, P] scores at once. select_by_threshold reaches the same
pages as the stable sort of select_from_scores through the k-th largest score (torch.topk)
and an index-ordered count of the ties at it: the lower page index wins a tie, as there.
Run `python -m pytest tests/engine/teacher/test_selection.py -q`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from sparrow.engine.kv_cache import centroid_torch_dtype
from sparrow.kernels.kv_write import round_centroids
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import PageSummary, ScoringRule, get_rule, page_bounds
from sparrow.sparse.selection import eligible_pages, read_every_page


def page_centroids(k: torch.Tensor, page_size: int, centroid_dtype: str) -> torch.Tensor:
    """Centroids [P, Hkv, D] float32 of one sequence's keys k [T, Hkv, D]: the full pages'
    means rounded as the engine's KVCache stores them (the cache dtype is k's); zeros for the
    partial page, which is never scored (it is always read)."""
    length, kv_heads, dim = k.shape
    width = -(-length // page_size)
    full = length // page_size
    centroids = torch.zeros(width, kv_heads, dim, device=k.device)
    full_keys = k[: full * page_size].float().view(full, page_size, kv_heads, dim)
    stored = centroid_torch_dtype(centroid_dtype, k.dtype)
    centroids[:full] = round_centroids(full_keys.mean(1), stored).float()
    return centroids


def sequence_pages(
    k: torch.Tensor, page_size: int, centroid_dtype: str, rule: ScoringRule
) -> PageSummary:
    """What `rule` reads of one sequence's pages (k [T, Hkv, D]), as the decode's KV cache
    holds it: centroids (page_centroids), key bounds [P, 2, Hkv, D] of the full pages in
    k's dtype (zeros for the partial page, never scored), or the keys themselves (oracle)."""
    if not rule.decodes:
        return PageSummary(keys=k, page_size=page_size)
    if not rule.bounds:
        return PageSummary(centroids=page_centroids(k, page_size, centroid_dtype))
    length, kv_heads, dim = k.shape
    full = length // page_size
    bounds = torch.zeros(-(-length // page_size), 2, kv_heads, dim, dtype=k.dtype, device=k.device)
    bounds[:full] = page_bounds(k[: full * page_size].view(full, page_size, kv_heads, dim))
    return PageSummary(bounds=bounds)


def chunk_scores(
    rule: ScoringRule, q: torch.Tensor, pages: PageSummary, first: int, last: int, page_size: int
) -> torch.Tensor:
    """Scores [last - first, Hkv, n] of positions first..last-1 (q: the sequence's [T, Hq, D]),
    n = pages present at position last - 1: the rule's own product, as decode computes it."""
    if pages.keys is not None:  # oracle: each row's attention over keys 0..its position
        position = torch.arange(first, last, device=q.device)
        chunk = PageSummary(keys=pages.keys[:last], positions=position, page_size=page_size)
        return rule.score(q[first:last], chunk)
    width = (last - 1) // page_size + 1
    chunk = PageSummary(
        centroids=None if pages.centroids is None else pages.centroids[:width],
        bounds=None if pages.bounds is None else pages.bounds[:width],
    )
    return rule.score(q[first:last], chunk)


def row_elements(rule: ScoringRule, q_heads: int, kv_heads: int, length: int, width: int) -> int:
    """Float32 elements one row's scoring holds at once (chunk sizing): the oracle's dense
    scores over every key, a per-head rule's scores of each query head, else [Hkv, width]."""
    if not rule.decodes:
        return q_heads * length
    return (q_heads if rule.per_head else kv_heads) * width


def select_by_threshold(
    scores: torch.Tensor,
    num_pages: torch.Tensor,
    topk: torch.Tensor,
    reserved_bos: int,
    reserved_eos: int,
    widest: int | None = None,
) -> torch.Tensor:
    """select_from_scores' pages [B, Hkv, P] without a sort. num_pages, topk: [B];
    widest: max(topk) when the caller knows it (saves a device sync)."""
    rows, heads, width = scores.shape
    device = scores.device
    page = torch.arange(width, device=device).view(1, 1, width)
    count = num_pages.to(device).view(rows, 1, 1)
    eligible = eligible_pages(count, width, reserved_bos, reserved_eos)
    reserved = (page < count) & ~eligible
    topk = topk.to(device).view(rows, 1, 1)
    widest = min(int(topk.max()) if widest is None else widest, width)
    if widest < 1:
        return reserved
    masked = scores.float().masked_fill(~eligible, float("-inf"))
    # the k-th largest eligible score; -inf when fewer than k pages are eligible (all read)
    index = (topk.clamp(1, widest) - 1).expand(rows, heads, 1)
    kth = masked.topk(widest, dim=-1).values.gather(-1, index)
    kth = torch.where(topk > 0, kth, float("inf"))
    greater = masked > kth
    tied = (masked == kth) & eligible
    room = topk - greater.sum(-1, keepdim=True)
    chosen = greater | (tied & (tied.cumsum(-1, dtype=torch.int32) <= room))
    return reserved | chosen


def select_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    prompt_len: int,
    schedule: Schedule,
    centroid_dtype: str,
    rows: int,
    dense_heads: tuple[int, ...] = (),
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(first, last, pages [last - first, Hkv, n] bool) for consecutive chunks of `rows`
    positions of one sequence (q [T, Hq, D], k [T, Hkv, D]); see the module docstring.
    dense_heads: the KV heads of this layer that read every page (schedule.dense_heads_of)."""
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    q, k = q.detach(), k.detach()  # the selection is discrete: no graph through it
    length, kv_heads, _ = k.shape
    size = schedule.page_size
    device = k.device
    rule = get_rule(schedule.selection)
    pages_of = sequence_pages(k, size, centroid_dtype, rule) if prompt_len < length else None
    topk_of_bin = torch.tensor(schedule.topk_pages, device=device)
    for first in range(0, length, rows):
        last = min(first + rows, length)
        position = torch.arange(first, last, device=device)
        num_pages = position // size + 1
        width = (last - 1) // size + 1
        present = torch.arange(width, device=device).view(1, 1, width) < num_pages.view(-1, 1, 1)
        if last <= prompt_len:
            yield first, last, present.expand(last - first, kv_heads, width)
            continue
        scores = chunk_scores(rule, q, pages_of, first, last, size)
        bins = schedule.bin_of(position)
        # a schedule is non-decreasing over bins: the chunk's last row has its largest k
        pages = select_by_threshold(
            scores,
            num_pages,
            topk_of_bin[bins],
            schedule.reserved_bos,
            schedule.reserved_eos,
            schedule.topk_for_position(last - 1),
        )
        pages = read_every_page(pages, num_pages, dense_heads)
        if first < prompt_len:  # prompt positions are dense, as prefill
            pages[: prompt_len - first] = present[: prompt_len - first]
        yield first, last, pages


def gather_pages(chunks: list[torch.Tensor], width: int) -> torch.Tensor:
    """Chunks' page masks padded to `width` columns and stacked: [T, Hkv, width]."""
    rows = sum(c.shape[0] for c in chunks)
    out = torch.zeros(rows, chunks[0].shape[1], width, dtype=torch.bool, device=chunks[0].device)
    start = 0
    for chunk in chunks:
        out[start : start + chunk.shape[0], :, : chunk.shape[-1]] = chunk
        start += chunk.shape[0]
    return out
