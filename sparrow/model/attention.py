"""Dense causal attention over a packed batch, with no KV cache: prefill-only use and tests.

    hidden = model(input_ids, positions, causal_attention([5, 3]))

The batch holds the sequences end to end (lengths `seq_lens`); each token attends to itself
and the earlier tokens of its own sequence only. Grouped-query heads are expanded to the
query heads, then torch's scaled_dot_product_attention runs per sequence (scale
1/sqrt(head_dim), as the Qwen and Llama families use).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from sparrow.errors import SparrowError
from sparrow.model.layers import AttentionFn


class AttentionInputError(SparrowError, ValueError):
    """Sequence lengths that do not describe the packed batch."""


def causal_attention(seq_lens: Sequence[int]) -> AttentionFn:
    """An AttentionFn doing causal attention within each of the packed sequences."""
    lengths = [int(n) for n in seq_lens]
    if not lengths or any(n < 1 for n in lengths):
        raise AttentionInputError(f"seq_lens must be positive lengths, got {lengths}")
    total = sum(lengths)

    def attention(layer_index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[0] != total or k.shape[0] != total or v.shape[0] != total:
            raise AttentionInputError(
                f"layer {layer_index}: seq_lens sum to {total} tokens but q, k, v have "
                f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
            )
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        start = 0
        for n in lengths:
            span = slice(start, start + n)
            # [n, H, D] -> [1, H, n, D]
            qs = q[span].transpose(0, 1).unsqueeze(0)
            ks = k[span].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
            vs = v[span].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
            out[span] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(
                0, 1
            )
            start += n
        return out

    return attention
