"""Teacher-forced forward: logits at every position of given sequences, sparse or dense.

    logits = teacher_forced_logits(model, [ids_a, ids_b], prompt_lens=[5, 9], schedule=s)
    logits[0][t]   # [vocab] float32: what decoding ids_a one token at a time gives at t
    logits = teacher_forced_logits(..., centroid_dtype="float8_e4m3fn")  # the engine's setting

Prompt positions attend densely (as prefill). Every later position t (its token was
generated) attends as the decode step that fed it did: the cache then held t + 1 tokens,
n = t // page_size + 1 pages; the centroids of the pages full by then (a page's centroid is
fixed once it fills, so it is computed once from the sequence's keys, rounded to the
engine's centroid dtype, EngineConfig.centroid_dtype, as its KVCache stores them); its own
q_mean;
top-k from the schedule at position t; reserved_bos and reserved_eos pages always read;
layers in skip_layers dense. With schedule=None every position is dense causal (the dense
variant, equal to transformers' forward). Masked attention, no cache writes: gradients flow
to q, k, v (DistillSparse); the page selection itself is discrete and computed without grad.
Queries go in chunks of `query_chunk` so memory is [Hq, chunk, T] per sequence and layer.
Run `python -m pytest tests/sparrow_core/engine/test_teacher_forced.py -q`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from sparrow_core.engine.attention import masked_attention
from sparrow_core.engine.kv_cache import centroid_torch_dtype
from sparrow_core.kernels.kv_write import round_centroids
from sparrow_core.sparse.schedule import Schedule
from sparrow_core.sparse.selection import group_query_mean, select_from_scores, token_mask

# called with (layer, sequence index, page_mask [T, Hkv, P]) for each sparse layer (tests)
TeacherSelectionHook = Callable[[int, int, torch.Tensor], None]


def teacher_forced_logits(model: torch.nn.Module, sequences: Sequence[Sequence[int] | torch.Tensor],
                          prompt_lens: Sequence[int] | None = None,
                          schedule: Schedule | None = None, query_chunk: int = 1024,
                          on_selection: TeacherSelectionHook | None = None,
                          centroid_dtype: str = "cache") -> list[torch.Tensor]:
    """Float32 logits [T_i, vocab] per sequence; sparse at generated positions if scheduled;
    centroid_dtype as the decoding engine's EngineConfig.centroid_dtype."""
    hidden = teacher_forced_hidden(model, sequences, prompt_lens, schedule, query_chunk,
                                   on_selection, centroid_dtype)
    return [model.compute_logits(h) for h in hidden]


def teacher_forced_hidden(model: torch.nn.Module, sequences: Sequence[Sequence[int] | torch.Tensor],
                          prompt_lens: Sequence[int] | None = None,
                          schedule: Schedule | None = None, query_chunk: int = 1024,
                          on_selection: TeacherSelectionHook | None = None,
                          centroid_dtype: str = "cache") -> list[torch.Tensor]:
    """Final hidden states [T_i, hidden] per sequence (see teacher_forced_logits)."""
    device = next(model.parameters()).device
    ids = [torch.as_tensor(s, dtype=torch.long, device=device).flatten() for s in sequences]
    lens = [int(t.shape[0]) for t in ids]
    if prompt_lens is None:
        if schedule is not None:
            raise ValueError("a sparse teacher-forced forward needs prompt_lens")
        prompt_lens = lens
    prompt_lens = [int(p) for p in prompt_lens]
    if len(prompt_lens) != len(lens) or any(not 1 <= p <= n for p, n in zip(prompt_lens, lens)):
        raise ValueError(f"prompt_lens {prompt_lens} must give 1 <= prompt_len <= length for "
                         f"sequences of lengths {lens}")
    attention = TeacherForcedAttention(lens, prompt_lens, schedule, query_chunk, on_selection,
                                       centroid_dtype)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    hidden = model(torch.cat(ids), positions, attention)
    return list(hidden.split(lens))


class TeacherForcedAttention:
    """AttentionFn over packed whole sequences, each query with its own page selection."""

    def __init__(self, seq_lens: list[int], prompt_lens: list[int], schedule: Schedule | None,
                 query_chunk: int = 1024, on_selection: TeacherSelectionHook | None = None,
                 centroid_dtype: str = "cache"):
        if query_chunk < 1:
            raise ValueError(f"query_chunk must be positive, got {query_chunk}")
        centroid_torch_dtype(centroid_dtype, torch.float32)  # refuse a bad name now
        self.centroid_dtype = centroid_dtype
        self.seq_lens = seq_lens
        self.prompt_lens = prompt_lens
        self.schedule = schedule
        self.query_chunk = query_chunk
        self.on_selection = on_selection

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        sparse = self.schedule is not None and self.schedule.is_sparse_layer(layer)
        outputs, start = [], 0
        for index, (length, prompt_len) in enumerate(zip(self.seq_lens, self.prompt_lens)):
            span = slice(start, start + length)
            page_mask = None
            if sparse and prompt_len < length:
                page_mask = self._select(q[span], k[span], prompt_len)
                if self.on_selection is not None:
                    self.on_selection(layer, index, page_mask)
            outputs.append(self._attend(q[span], k[span], v[span], page_mask))
            start += length
        return torch.cat(outputs)

    @torch.no_grad()
    def _select(self, q: torch.Tensor, k: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Pages each position reads [T, Hkv, P]; prompt positions read every page."""
        schedule = self.schedule
        page_size = schedule.page_size
        length, kv_heads, dim = k.shape
        width = -(-length // page_size)
        full = length // page_size
        centroids = torch.zeros(width, kv_heads, dim, device=k.device)
        full_keys = k[: full * page_size].float().view(full, page_size, kv_heads, dim)
        # rounded as the engine's KVCache stores them (the cache dtype is k's)
        stored = centroid_torch_dtype(self.centroid_dtype, k.dtype)
        centroids[:full] = round_centroids(full_keys.mean(1), stored).float()
        scores = torch.einsum("thd,phd->thp", group_query_mean(q, kv_heads), centroids)
        position = torch.arange(length, device=k.device)
        num_pages = position // page_size + 1
        bins = (position // schedule.bin_tokens).clamp(max=schedule.num_bins - 1)
        topk = torch.tensor(schedule.topk_pages, device=k.device)[bins]
        mask = select_from_scores(scores, num_pages, topk, schedule.reserved_bos,
                                  schedule.reserved_eos)
        mask[:prompt_len] = True  # prompt positions are dense, as prefill
        return mask & (torch.arange(width, device=k.device) < num_pages.view(-1, 1, 1))

    def _attend(self, q, k, v, page_mask):
        """Causal attention of one sequence, restricted per query to its pages if given."""
        length = q.shape[0]
        chunks = []
        kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        for first in range(0, length, self.query_chunk):
            last = min(first + self.query_chunk, length)
            rows = torch.arange(first, last, device=q.device)
            mask = rows.view(-1, 1) >= torch.arange(last, device=q.device).view(1, -1)
            if page_mask is not None:
                tokens = token_mask(page_mask[first:last], self.schedule.page_size,
                                    torch.full((last - first,), last, device=q.device))
                mask = mask.unsqueeze(1) & tokens[..., :last]  # [Q, Hkv, K]
                mask = mask.transpose(0, 1)[None]
            keys, values = kh[:, :, :last], vh[:, :, :last]
            result = masked_attention(q[first:last].transpose(0, 1)[None], keys, values, mask)
            chunks.append(result[0].transpose(0, 1))
        return torch.cat(chunks).to(q.dtype)
