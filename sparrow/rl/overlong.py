"""Samples that run long: DAPO's soft overlong penalty and the mask that drops truncated ones.

    from sparrow.rl.overlong import overlong_penalties, kept_samples
    rewards = rewards + overlong_penalties(lengths, max_new_tokens=4096, buffer=512, penalty=1.0)
    keep = kept_samples(finish_reasons, mask_truncated=True)      # bool [batch]

Soft overlong punishment (DAPO, Yu et al. 2025, eq. 13): with L_max = max_new_tokens and
buffer L_cache, a response of length L gets
    0                                   if L <= L_max - L_cache
    (L_max - L_cache - L) / L_cache     if L_max - L_cache < L <= L_max   (0 down to -1)
    -1                                  if L > L_max
times `penalty` (algo.overlong_penalty), added to its reward (algo.overlong_buffer = L_cache;
0 turns it off). Overlong filtering (algo.mask_truncated) instead leaves every sample cut at
the length limit (finish_reason "length") out of the loss: its tokens leave the mask, so they
count in no denominator either. Tests compare both with plain loops (tests/rl/test_overlong.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sparrow.rl.checks import RLInputError


def overlong_penalties(
    lengths: Sequence[int] | torch.Tensor, max_new_tokens: int, buffer: int, penalty: float = 1.0
) -> torch.Tensor:
    """Per sample, the (non-positive) reward shaping above; float64 [batch]. buffer 0: zeros."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    if lengths.dim() != 1:
        raise RLInputError(f"lengths must be 1-D, got {tuple(lengths.shape)}")
    if buffer < 0 or max_new_tokens < 1 or buffer > max_new_tokens:
        raise RLInputError(
            f"need 0 <= buffer <= max_new_tokens and max_new_tokens >= 1, got buffer {buffer}, "
            f"max_new_tokens {max_new_tokens}"
        )
    if penalty < 0:
        raise RLInputError(f"penalty must be >= 0, got {penalty}")
    if buffer == 0:
        return torch.zeros_like(lengths)
    start = max_new_tokens - buffer
    ramp = ((start - lengths) / buffer).clamp(min=-1.0, max=0.0)
    return ramp * penalty


def kept_samples(finish_reasons: Sequence[str], mask_truncated: bool) -> torch.Tensor:
    """bool [batch]: False for a sample cut at the length limit when mask_truncated is on."""
    return torch.tensor(
        [not (mask_truncated and reason == "length") for reason in finish_reasons],
        dtype=torch.bool,
    )
