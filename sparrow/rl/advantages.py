"""Advantage estimators (registry ADVANTAGE_ESTIMATORS): group-relative baselines per prompt.

    from sparrow.rl import ADVANTAGE_ESTIMATORS, per_token_advantages
    advantages = ADVANTAGE_ESTIMATORS.get("grpo")(rewards, group_size=8)   # [prompts * 8]
    token_advantages = per_token_advantages(advantages, mask)              # [batch, tokens]

Every estimator has one signature, estimator(rewards, group_size, eps=1e-6) -> Tensor:
rewards is 1-D with the group_size samples of one prompt contiguous, and the result has the
same shape (float32 unless rewards are float64). A group whose rewards are all equal gives
exactly 0 for every sample, whatever floating-point rounding the mean would leave behind.
Formulas and the choice of std: docs/rl.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sparrow.registry import Registry
from sparrow.rl.checks import RLInputError, as_bool_mask

AdvantageEstimator = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def _grouped(rewards: torch.Tensor, group_size: int, minimum: int = 1) -> torch.Tensor:
    """Check the input and view it as [num_prompts, group_size] in a float dtype."""
    if not isinstance(rewards, torch.Tensor):
        raise RLInputError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise RLInputError(f"rewards must be 1-D [num_prompts * group], got {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < minimum:
        raise RLInputError(f"group_size must be an integer >= {minimum}, got {group_size!r}")
    if rewards.numel() % group_size:
        raise RLInputError(
            f"rewards has {rewards.numel()} samples, not a multiple of group_size {group_size}"
        )
    if rewards.dtype != torch.float64:
        rewards = rewards.to(torch.float32)
    if not bool(torch.isfinite(rewards).all()):
        raise RLInputError("rewards must be finite (a failed reward scores 0, not NaN)")
    return rewards.detach().reshape(-1, group_size)


def _zero_constant_groups(advantages: torch.Tensor, grouped: torch.Tensor) -> torch.Tensor:
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).reshape(-1)


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps), std with Bessel's correction (n - 1).

    The unbiased std matches torch.std's default, which the reference implementation (built
    on verl) uses, so the reference hyperparameters carry over; it differs from the population
    std by sqrt(n / (n - 1)), 1.07 at 8 samples. A group of one sample has no baseline and
    gets 0, like any group whose rewards are all equal.
    """
    if eps < 0:
        raise RLInputError(f"eps must be >= 0, got {eps}")
    grouped = _grouped(rewards, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if group_size == 1:
        return torch.zeros_like(centered).reshape(-1)
    std = grouped.std(dim=1, correction=1, keepdim=True)
    return _zero_constant_groups(centered / (std + eps), grouped)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """r_i - mean of the other group_size - 1 rewards of its group (leave-one-out baseline).

    No scaling by the std, so eps is unused (kept for the common signature). Needs at least
    two samples per prompt.
    """
    grouped = _grouped(rewards, group_size, minimum=2)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return _zero_constant_groups(grouped - others_mean, grouped)


def per_token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Spread per-sample advantages [batch] over the tokens [batch, tokens]; 0 off the mask."""
    if advantages.dim() != 1 or mask.dim() != 2 or advantages.shape[0] != mask.shape[0]:
        raise RLInputError(
            f"advantages {tuple(advantages.shape)} must be [batch] for a mask [batch, tokens], "
            f"got mask {tuple(mask.shape)}"
        )
    mask = as_bool_mask(mask)
    spread = advantages[:, None].expand(mask.shape)
    return torch.where(mask, spread, torch.zeros_like(spread))
