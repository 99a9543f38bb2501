"""The attention object of one forward step: writes the paged cache, then reads it.

    meta = StepMetadata.decode(slot_mapping, filled_pages, page_tables, num_tokens, topk)
    attention = PagedAttention(cache, meta, schedule, on_selection=None)
    hidden = model(input_ids, positions, attention)      # attention(layer, q, k, v) per layer

Built per step from explicit metadata (never a global mutable context). Per layer it stores
the step's post-RoPE k, v at their slots, computes the centroid of every page this step
filled, then runs one of the three entry points of engine/attention.py: prefill (dense causal
over the new tokens), dense decode, or sparse decode (page selection from
sparse/selection.py over the scores of the schedule's rule, sparse/scoring.py, with the
schedule's dense_heads reading every page; then exact attention over the selected pages).
Layers in the schedule's skip_layers, and every layer without a schedule, decode densely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparrow.engine import attention as paths
from sparrow.engine.kv_cache import KVCache
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import PageSummary, get_rule
from sparrow.sparse.selection import read_every_page, select_from_scores

# called with (layer, page_mask [B, Hkv, W]) after each sparse selection (debug, tests)
SelectionHook = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class StepMetadata:
    """Everything one step's attention needs; the decode fields are None for prefill.

    slot_mapping [T]: flat cache slot of each new token; filled_pages [F]: physical pages that
    become full in this step; prefill_lens: new tokens per sequence (prefill); page_tables
    [B, W], num_tokens [B] (cached tokens, current included), topk [B] (decode; topk None
    means dense decode).
    """

    slot_mapping: torch.Tensor
    filled_pages: torch.Tensor
    prefill_lens: tuple[int, ...] | None = None
    page_tables: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None
    topk: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if (self.prefill_lens is None) == (self.page_tables is None):
            raise ValueError(
                "StepMetadata is either prefill (prefill_lens) or decode (page_tables)"
            )
        if self.prefill_lens is not None and sum(self.prefill_lens) != self.slot_mapping.shape[0]:
            raise ValueError("prefill_lens must sum to the number of slots")
        if self.page_tables is not None:
            batch = self.page_tables.shape[0]
            if self.num_tokens is None or self.num_tokens.shape != (batch,):
                raise ValueError(f"num_tokens must have shape ({batch},)")
            if self.slot_mapping.shape != (batch,):
                raise ValueError(f"a decode step writes one slot per sequence ({batch})")
            if self.topk is not None and self.topk.shape != (batch,):
                raise ValueError(f"topk must have shape ({batch},)")

    @property
    def is_prefill(self) -> bool:
        return self.prefill_lens is not None


class PagedAttention:
    def __init__(
        self,
        cache: KVCache,
        meta: StepMetadata,
        schedule: Schedule | None,
        on_selection: SelectionHook | None = None,
    ):
        if schedule is not None and schedule.page_size != cache.page_size:
            raise ValueError(
                f"schedule page_size {schedule.page_size} differs from the cache's "
                f"{cache.page_size}"
            )
        self.cache = cache
        self.meta = meta
        self.schedule = schedule
        self.on_selection = on_selection

    def _scores(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """The schedule's rule over the cached pages: [B, Hkv, W] float32. Summaries are read
        in their stored dtype (float8 centroids included) and upcast by the rule."""
        rule = get_rule(self.schedule.selection)
        if not rule.decodes:
            raise ValueError(f"page-scoring rule {rule.name!r} cannot decode (replay only)")
        tables, cache = self.meta.page_tables, self.cache
        if rule.bounds and cache.bounds is None:
            raise ValueError(f"page-scoring rule {rule.name!r} needs a KV cache with bounds")
        pages = PageSummary(
            centroids=None if rule.bounds else cache.centroids[layer][tables],  # [B, W, Hkv, D]
            bounds=cache.bounds[layer][tables] if rule.bounds else None,  # [B, W, 2, Hkv, D]
        )
        return rule.score(q, pages)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        meta, cache = self.meta, self.cache
        cache.write(layer, meta.slot_mapping, k, v)
        cache.update_centroids(layer, meta.filled_pages)
        if meta.is_prefill:
            return paths.prefill_attention(q, k, v, list(meta.prefill_lens))
        k_pages, v_pages = cache.k[layer], cache.v[layer]
        schedule = self.schedule
        if meta.topk is None or schedule is None or not schedule.is_sparse_layer(layer):
            return paths.dense_decode_attention(
                q, k_pages, v_pages, meta.page_tables, meta.num_tokens
            )
        num_pages = (meta.num_tokens + cache.page_size - 1) // cache.page_size
        page_mask = select_from_scores(
            self._scores(layer, q),
            num_pages,
            meta.topk,
            schedule.reserved_bos,
            schedule.reserved_eos,
        )
        page_mask = read_every_page(page_mask, num_pages, schedule.dense_heads_of(layer))
        if self.on_selection is not None:
            self.on_selection(layer, page_mask)
        return paths.sparse_decode_attention(
            q, k_pages, v_pages, meta.page_tables, meta.num_tokens, page_mask
        )
