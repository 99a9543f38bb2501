"""Block-sparse page selection: the PyTorch reference (GPU kernels must match it exactly).

    q_mean = group_query_mean(q, num_kv_heads)                 # [B, Hkv, D] float32
    mask = select_pages(q_mean, centroids, num_pages, topk, reserved_bos=1, reserved_eos=2)
    # mask [B, Hkv, P] bool: the pages each sequence (or query position) reads per KV head

For one query (a sequence's decode step, or one position of a teacher-forced sequence) whose
cache holds n pages: pages 0..reserved_bos-1 and the last reserved_eos pages (the partial
page among them) are always read; the pages between them are eligible and scored by
q_mean . centroid; the top-k eligible pages are read; with no more than k eligible pages
every page is read (a dense step). Ties in score go to the lower page index. Batched over
B queries with ragged page counts: columns at or past a row's n are padding and never read.
Other scores than q_mean . centroid come from the rules of sparse/scoring.py (the schedule's
`selection`), ranked by select_from_scores alike; read_every_page applies dense_heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sparrow import schedule_math
from sparrow.sparse.scoring import group_query_mean

__all__ = [
    "eligible_pages",
    "group_query_mean",
    "pages_read",
    "read_every_page",
    "score_pages",
    "select_from_scores",
    "select_pages",
    "token_mask",
]


def score_pages(q_mean: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Scores q_mean . centroid: q_mean [B, Hkv, D], centroids [B, P, Hkv, D] -> [B, Hkv, P]."""
    return torch.einsum("bhd,bphd->bhp", q_mean.float(), centroids.float())


def select_pages(
    q_mean: torch.Tensor,
    centroids: torch.Tensor,
    num_pages: torch.Tensor,
    topk: torch.Tensor | int,
    reserved_bos: int,
    reserved_eos: int,
) -> torch.Tensor:
    """Pages read per query and KV head: [B, Hkv, P] bool (see the module docstring)."""
    return select_from_scores(
        score_pages(q_mean, centroids), num_pages, topk, reserved_bos, reserved_eos
    )


def eligible_pages(
    num_pages: torch.Tensor, width: int, reserved_bos: int, reserved_eos: int
) -> torch.Tensor:
    """[B, 1, width]: the pages a decode step may choose by score, of a cache holding
    num_pages [B] pages (the reserved first and last ones are read anyway, not chosen)."""
    page = torch.arange(width, device=num_pages.device).view(1, 1, width)
    count = num_pages.view(-1, 1, 1)
    return (page >= reserved_bos) & (page < count - reserved_eos)


def select_from_scores(
    scores: torch.Tensor,
    num_pages: torch.Tensor,
    topk: torch.Tensor | int,
    reserved_bos: int,
    reserved_eos: int,
) -> torch.Tensor:
    """The selection rule on given scores [B, Hkv, P]; num_pages, topk: [B] (or an int k)."""
    batch, _, width = scores.shape
    _check(num_pages, width, batch, reserved_bos, reserved_eos)
    device = scores.device
    topk = torch.as_tensor(topk, device=device).expand(batch)
    if (topk < 0).any():
        raise ValueError(f"topk must be >= 0, got {topk.tolist()}")
    page = torch.arange(width, device=device).view(1, 1, width)
    count = num_pages.to(device).view(batch, 1, 1)
    present = page < count
    eligible = eligible_pages(count, width, reserved_bos, reserved_eos)
    masked = scores.float().masked_fill(~eligible, float("-inf"))
    # rank of every page by descending score; the stable sort hands ties to the lower index
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, page.expand_as(order).contiguous())
    chosen = eligible & (rank < topk.view(batch, 1, 1))
    return (present & ~eligible) | chosen


def read_every_page(
    mask: torch.Tensor, num_pages: torch.Tensor, kv_heads: Sequence[int]
) -> torch.Tensor:
    """mask [B, Hkv, P] with the listed KV heads reading every present page (a schedule's
    dense_heads of one layer); num_pages [B]."""
    if not kv_heads:
        return mask
    mask = mask.clone()
    present = torch.arange(mask.shape[-1], device=mask.device) < num_pages.to(mask.device).view(
        -1, 1
    )
    for head in kv_heads:
        mask[:, head] = present
    return mask


def pages_read(
    num_pages: torch.Tensor | int, topk: torch.Tensor | int, reserved_bos: int, reserved_eos: int
) -> torch.Tensor:
    """Pages one sparse step reads per KV head: min(n, top-k + reserved), n when dense
    (sparrow.schedule_math.pages_read on tensors)."""
    return schedule_math.pages_read(
        torch.as_tensor(topk), reserved_bos, reserved_eos, torch.as_tensor(num_pages)
    )


def token_mask(page_mask: torch.Tensor, page_size: int, num_tokens: torch.Tensor) -> torch.Tensor:
    """Expand a page mask [B, Hkv, P] to tokens [B, Hkv, P * page_size], hiding slots at or
    past each row's token count (the unwritten tail of the partial page)."""
    batch, heads, width = page_mask.shape
    tokens = page_mask.repeat_interleave(page_size, dim=-1)
    slot = torch.arange(width * page_size, device=page_mask.device).view(1, 1, -1)
    return tokens & (slot < num_tokens.to(page_mask.device).view(batch, 1, 1))


def _check(
    num_pages: torch.Tensor, width: int, batch: int, reserved_bos: int, reserved_eos: int
) -> None:
    if num_pages.shape != (batch,):
        raise ValueError(f"num_pages must have shape ({batch},), got {tuple(num_pages.shape)}")
    if batch and int(num_pages.max()) > width:
        raise ValueError(
            f"a row holds {int(num_pages.max())} pages but the centroids have only {width} columns"
        )
    if reserved_bos < 0 or reserved_eos < 1:
        raise ValueError(
            f"need reserved_bos >= 0 and reserved_eos >= 1, got {reserved_bos}, {reserved_eos}"
        )
