"""Attention reference paths, one entry point per mode (GPU Triton kernels replace these).

    out = prefill_attention(q, k, v, seq_lens)                        # dense causal, no cache
    out = dense_decode_attention(q, k_pages, v_pages, page_tables, num_tokens)
    out = sparse_decode_attention(q, k_pages, v_pages, page_tables, num_tokens, page_mask)

Shapes: q [T or B, Hq, D]; k, v [T, Hkv, D]; k_pages, v_pages one layer of the cache
[num_pages, Hkv, page_size, D] (head-major); page_tables [B, W] physical page ids (padding entries may
hold any valid id); num_tokens [B] cached tokens per sequence, the current one included;
page_mask [B, Hkv, W] bool from sparrow.sparse.selection. Query head j reads KV head
j // (Hq / Hkv). Softmax scale 1/sqrt(D), computed in float32, returned in q's dtype.
The sparse path is exact softmax over the selected pages' tokens; this reference masks the
unselected ones, a kernel reads only the selected ones.
"""

from __future__ import annotations

import math

import torch

from sparrow.kernels.page_topk import lists_from_mask
from sparrow.kernels.paged_decode import paged_decode_attention, sparse_paged_decode_attention
from sparrow.kernels.prefill import prefill_attention_sdpa
from sparrow.kernels.runtime import HAS_TRITON
from sparrow.sparse.selection import token_mask


def on_gpu(*tensors: torch.Tensor) -> bool:
    """True when the GPU kernels serve these tensors (all on CUDA, triton installed)."""
    return HAS_TRITON and all(t.is_cuda for t in tensors)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped attention with an explicit mask (the shared math of every path).

    q [B, Hq, Q, D]; k, v [B, Hkv, K, D]; mask broadcastable to [B, Hkv, Q, K], True = read.
    Every query must read at least one key. Returns [B, Hq, Q, D] float32. Differentiable.
    """
    batch, heads, queries, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.float().view(batch, kv_heads, group, queries, dim)
    scores = torch.einsum("bhgqd,bhkd->bhgqk", qg, k.float()) / math.sqrt(dim)
    mask = mask.expand(batch, kv_heads, queries, k.shape[2]).unsqueeze(2)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgqk,bhkd->bhgqd", weights, v.float())
    return out.reshape(batch, heads, queries, dim)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int]
) -> torch.Tensor:
    """Dense causal attention within each sequence of a packed batch of new tokens."""
    if sum(seq_lens) != q.shape[0]:
        raise ValueError(f"seq_lens sum to {sum(seq_lens)} but the batch has {q.shape[0]} tokens")
    if q.is_cuda:
        return prefill_attention_sdpa(q, k, v, list(seq_lens))
    outputs = []
    start = 0
    for length in seq_lens:
        end = start + length
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        heads_first = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]
        out = masked_attention(*heads_first, causal)
        outputs.append(out[0].transpose(0, 1))
        start = end
    return torch.cat(outputs).to(q.dtype)


def dense_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_tables: torch.Tensor,
    num_tokens: torch.Tensor,
) -> torch.Tensor:
    """One query per sequence over every cached token of that sequence."""
    if on_gpu(q, k_pages, page_tables):
        return paged_decode_attention(q, k_pages, v_pages, page_tables, num_tokens)
    batch, width = page_tables.shape
    every_page = torch.ones(batch, k_pages.shape[1], width, dtype=torch.bool, device=q.device)
    return _paged_attention(q, k_pages, v_pages, page_tables, num_tokens, every_page)


def sparse_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_tables: torch.Tensor,
    num_tokens: torch.Tensor,
    page_mask: torch.Tensor,
) -> torch.Tensor:
    """One query per sequence over the tokens of its selected pages, per KV head."""
    batch, width = page_tables.shape
    expected = (batch, k_pages.shape[1], width)
    if tuple(page_mask.shape) != expected:
        raise ValueError(f"page_mask must have shape {expected}, got {tuple(page_mask.shape)}")
    if on_gpu(q, k_pages, page_tables, page_mask):
        lists, counts = lists_from_mask(page_mask)
        return sparse_paged_decode_attention(
            q, k_pages, v_pages, page_tables, num_tokens, lists, counts
        )
    return _paged_attention(q, k_pages, v_pages, page_tables, num_tokens, page_mask)


def _paged_attention(q, k_pages, v_pages, page_tables, num_tokens, page_mask):
    batch, width = page_tables.shape
    kv_heads, page_size, dim = k_pages.shape[1:]
    # gather each sequence's pages: [B, W, Hkv, page_size, D] -> [B, Hkv, W * page_size, D]
    k = k_pages[page_tables].transpose(1, 2).reshape(batch, kv_heads, width * page_size, dim)
    v = v_pages[page_tables].transpose(1, 2).reshape(batch, kv_heads, width * page_size, dim)
    mask = token_mask(page_mask, page_size, num_tokens).unsqueeze(2)  # [B, Hkv, 1, K]
    out = masked_attention(q.unsqueeze(2), k, v, mask)
    return out.squeeze(2).to(q.dtype)
