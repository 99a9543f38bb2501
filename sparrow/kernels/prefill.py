"""Prefill attention on GPU: dense causal attention within each packed sequence, through
torch's scaled_dot_product_attention (flash backend), one call per sequence.

    out = prefill_attention_sdpa(q, k, v, seq_lens)   # q [T, Hq, D]; k, v [T, Hkv, D]

One call per sequence because it measured far faster on an H100 than one SDPA call over the
packed batch with a block-causal mask (1.06 against 9.4 ms for 16 x 1,024 tokens, 0.49
against 2.3 ms for one 8,192-token prompt, 1.7B heads, bf16), and prefill runs once per
prompt group, a small share of a rollout, so no Triton kernel of our own is needed here.
Grouped-query heads use SDPA's enable_gqa (no expanded copy of k and v). The reference is
engine/attention.py's prefill_attention on the CPU path.
Tests: `python -m pytest tests/kernels -q`."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from sparrow.kernels.runtime import check


def prefill_attention_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int]
) -> torch.Tensor:
    """[T, Hq, D] causal attention within each sequence (lengths seq_lens), in q's dtype."""
    check(
        q.dim() == 3 and k.dim() == 3 and k.shape == v.shape,
        f"q must be [T, Hq, D] and k, v [T, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}",
    )
    check(
        sum(seq_lens) == q.shape[0] == k.shape[0],
        f"seq_lens sum to {sum(seq_lens)} but q has {q.shape[0]} and k {k.shape[0]} tokens",
    )
    check(
        q.shape[1] % k.shape[1] == 0,
        f"{q.shape[1]} query heads do not split into {k.shape[1]} KV heads",
    )
    out = torch.empty_like(q)
    start = 0
    for length in seq_lens:
        span = slice(start, start + length)
        # [n, H, D] -> [1, H, n, D]
        qs, ks, vs = (t[span].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            qs, ks.to(q.dtype), vs.to(q.dtype), is_causal=True, enable_gqa=True
        )
        out[span] = attended[0].transpose(0, 1)
        start += length
    return out
