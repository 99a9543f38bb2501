"""Page-scoring rules: how block-sparse selection ranks the eligible pages of one query.

    rule = SCORING_RULES.get("quest_maxhead")   # an unknown name lists the valid ones
    pages = PageSummary(centroids=c, bounds=b)  # [B, P, Hkv, D] per row, or [P, Hkv, D] shared
    scores = rule.score(q, pages)               # q [R, Hq, D] -> [R, Hkv, P] float32

Rules (docs/selection.md has the formulas, the cost and where each runs):
- centroid: q_mean . centroid, q_mean the mean of the KV group's query heads (the default);
- centroid_maxhead: q_h . centroid for each query head h of the group, max over the group;
- quest: sum over channels d of max(q_d kmin_d, q_d kmax_d) with q the group mean and kmin,
  kmax the page's per-channel key bounds (Quest, Tang et al. 2024; they score per query
  head, which is quest_maxhead here);
- quest_maxhead: the Quest bound of each query head, max over the group;
- oracle: the page's true attention mass under dense attention, mean over the group's query
  heads (needs every key: teacher-forced replay and analysis only, never decode).

The Quest bound is computed as q+ . kmax + q- . kmin (q+ = max(q, 0), q- = min(q, 0)): for
each channel one of the two products is the larger of q_d kmin_d and q_d kmax_d and the other
is zero, so it equals the published max form up to summation order, as two products.
Every rule returns float32 scores; selection (sparse/selection.py) ranks them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sparrow.registry import Registry

if TYPE_CHECKING:  # torch is imported where a rule computes: the rules' names and traits
    import torch  # (schedules, the cost model, the CLI's parser) do not need it

# where each bound lies along dim -3 of PageSummary.bounds [.., P, 2, Hkv, D]
MIN, MAX = 0, 1


@dataclass(frozen=True)
class PageSummary:
    """What a rule may read of the pages: per-row [B, P, ...] or shared by all rows [P, ...].

    centroids [.., P, Hkv, D]: the mean key of each full page; bounds [.., P, 2, Hkv, D]: the
    per-channel min (index MIN) and max (MAX) of its keys; keys [L, Hkv, D] and positions
    [R]: a sequence's keys and each row's position (oracle: attention over keys 0..position).
    """

    centroids: torch.Tensor | None = None
    bounds: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    page_size: int = 0


class ScoringRule(Protocol):
    """A page-scoring rule; capabilities are properties (docs/selection.md)."""

    name: str
    # reads the per-channel key bounds (the KV cache keeps them beside the centroids)
    bounds: bool
    # may run in decode (oracle needs every key, so it cannot)
    decodes: bool
    # vectors it reads per page and KV head (centroid 1, bounds 2): the scoring bytes
    summary_vectors: int
    # scores every query head of a group (FLOPs times the group size), then takes the max
    per_head: bool

    def score(self, q: torch.Tensor, pages: PageSummary) -> torch.Tensor: ...


SCORING_RULES: Registry[ScoringRule] = Registry("page-scoring rule")


def _dot(q: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """q [R, Hkv, D] (or [R, Hkv, G, D]) dotted with per-page vectors, shared [P, Hkv, D] or
    per row [R, P, Hkv, D] -> [R, Hkv, P] (or [R, Hkv, G, P]) float32."""
    grouped = "g" if q.dim() == 4 else ""
    shared = vectors.dim() == 3
    pattern = f"rh{grouped}d,{'' if shared else 'r'}phd->rh{grouped}p"
    import torch

    return torch.einsum(pattern, q.float(), vectors.float())


def group_query_mean(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Mean of the query heads of each KV group: q [B, Hq, D] -> [B, Hkv, D] float32.

    Query head j belongs to KV head j // (Hq / Hkv), the grouping of transformers' repeat_kv.
    """
    return query_groups(q, num_kv_heads).mean(dim=2)


def query_groups(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hkv, G, D] float32, G = Hq / Hkv query heads per KV head."""
    batch, heads, dim = q.shape
    if heads % num_kv_heads:
        raise ValueError(f"{heads} query heads do not split into {num_kv_heads} KV groups")
    return q.float().view(batch, num_kv_heads, heads // num_kv_heads, dim)


def _kv_heads(pages: PageSummary) -> int:
    for tensor in (pages.centroids, pages.bounds, pages.keys):
        if tensor is not None:
            return tensor.shape[-2]
    raise ValueError("a PageSummary needs centroids, bounds or keys")


def _need(tensor: torch.Tensor | None, rule: str, what: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"page-scoring rule {rule!r} needs the pages' {what}")
    return tensor


def quest_bound(q: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """sum_d max(q_d kmin_d, q_d kmax_d) as q+ . kmax + q- . kmin (module docstring);
    bounds [.., P, 2, Hkv, D]."""
    q = q.float()
    low, high = bounds.select(-3, MIN), bounds.select(-3, MAX)
    return _dot(q.clamp(min=0), high) + _dot(q.clamp(max=0), low)


@dataclass(frozen=True)
class _Rule:
    name: str
    bounds: bool
    decodes: bool
    summary_vectors: int
    per_head: bool


class CentroidRule(_Rule):
    def score(self, q, pages):
        centroids = _need(pages.centroids, self.name, "centroids")
        if self.per_head:
            return _dot(query_groups(q, _kv_heads(pages)), centroids).amax(dim=2)
        return _dot(group_query_mean(q, _kv_heads(pages)), centroids)


class QuestRule(_Rule):
    def score(self, q, pages):
        bounds = _need(pages.bounds, self.name, "key bounds")
        if self.per_head:
            return quest_bound(query_groups(q, _kv_heads(pages)), bounds).amax(dim=2)
        return quest_bound(group_query_mean(q, _kv_heads(pages)), bounds)


class OracleRule(_Rule):
    def score(self, q, pages):
        """Attention mass per page of each row (dense softmax over keys 0..position), mean
        over the group's query heads: q [R, Hq, D] against the shared keys [L, Hkv, D]."""
        import torch

        keys = _need(pages.keys, self.name, "keys (replay only)")
        positions = _need(pages.positions, self.name, "row positions")
        size = pages.page_size
        length, kv_heads, dim = keys.shape
        logits = _dot(query_groups(q, kv_heads), keys) / math.sqrt(dim)  # [R, Hkv, G, L]
        future = torch.arange(length, device=q.device) > positions.view(-1, 1, 1, 1)
        weights = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
        width = -(-length // size)
        padded = torch.nn.functional.pad(weights, (0, width * size - length))
        mass = padded.view(*weights.shape[:3], width, size).sum(-1)
        return mass.mean(dim=2)


for _rule in (
    CentroidRule("centroid", bounds=False, decodes=True, summary_vectors=1, per_head=False),
    CentroidRule("centroid_maxhead", bounds=False, decodes=True, summary_vectors=1, per_head=True),
    QuestRule("quest", bounds=True, decodes=True, summary_vectors=2, per_head=False),
    QuestRule("quest_maxhead", bounds=True, decodes=True, summary_vectors=2, per_head=True),
    OracleRule("oracle", bounds=False, decodes=False, summary_vectors=0, per_head=True),
):
    SCORING_RULES.register(_rule.name)(_rule)


def get_rule(name: str) -> ScoringRule:
    """The rule registered as `name`; an unknown name raises ValueError listing the valid."""
    try:
        return SCORING_RULES.get(name)
    except KeyError as err:
        raise ValueError(err.args[0]) from None


def page_bounds(keys: torch.Tensor) -> torch.Tensor:
    """Per-channel bounds of pages' keys [.., page_size, Hkv, D] -> [.., 2, Hkv, D] in the
    keys' dtype (a min and a max are exact in any dtype: nothing to round)."""
    import torch

    return torch.stack([keys.amin(dim=-3), keys.amax(dim=-3)], dim=-3)
