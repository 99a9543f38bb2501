"""Loss aggregation: the one function every policy loss reduces its per-token values through.

    from sparrow.rl.aggregate import aggregate, masked_mean
    loss = aggregate(loss_per_token, mask, "token_mean")

Modes (the config's algo.loss_agg):
- token_mean: sum over every masked token / number of masked tokens (the reference runs);
- sequence_mean: mean over the masked tokens of each sequence, then mean over the sequences
  that have at least one masked token (a sequence with none has no mean and is left out).

`normalizer` replaces the denominator (masked tokens, or non-empty sequences) so that a batch
split into micro-batches sums to the full-batch loss: pass the whole batch's count to each
micro-batch (see count_for). Values off the mask never reach the result, NaN included.
"""

from __future__ import annotations

import torch

from sparrow.rl.checks import RLInputError, as_bool_mask, check_same_2d

AGGREGATIONS = ("token_mean", "sequence_mean")


def count_for(mask: torch.Tensor, mode: str) -> int:
    """The denominator `mode` uses for this mask: masked tokens or non-empty sequences."""
    mask = as_bool_mask(mask)
    _check_mode(mode)
    if mode == "token_mean":
        return int(mask.sum())
    return int(mask.any(dim=1).sum())


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, normalizer: float | None = None
) -> torch.Tensor:
    """Reduce per-token values [batch, tokens] to a scalar by `mode` (see the module doc).

    With nothing masked the result is a zero that still carries the graph of `values`.
    """
    check_same_2d(values=values, mask=mask)
    mask = as_bool_mask(mask)
    _check_mode(mode)
    if normalizer is not None and not normalizer > 0:
        raise RLInputError(f"normalizer must be > 0, got {normalizer}")
    kept = torch.where(mask, values, torch.zeros_like(values))
    if mode == "token_mean":
        total = kept.sum()
    else:
        tokens = mask.sum(dim=1)
        total = (kept.sum(dim=1) / tokens.clamp(min=1).to(kept.dtype)).sum()
    denominator = normalizer if normalizer is not None else max(count_for(mask, mode), 1)
    return total / denominator


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `values` over the masked tokens as a Python float (0.0 when nothing is masked)."""
    mask = as_bool_mask(mask)
    count = int(mask.sum())
    if count == 0:
        return 0.0
    values = values.detach().to(torch.float64)
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / count)


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise RLInputError(
            f"loss aggregation {mode!r} is unknown; valid: {', '.join(AGGREGATIONS)}"
        )
