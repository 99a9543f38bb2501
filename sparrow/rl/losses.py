"""Policy losses (registry POLICY_LOSSES): PPO clipped surrogate with truncated importance sampling.

    from sparrow.rl import POLICY_LOSSES, PolicyLossConfig
    cfg = PolicyLossConfig.from_algo(config.algo)
    loss, metrics = POLICY_LOSSES.get(config.algo.loss)(
        logprobs, old_logprobs, actor_logprobs, advantages, mask, cfg)
    loss.backward()

One signature for every loss: loss_fn(logprobs, old_logprobs, actor_logprobs, advantages,
mask, cfg, *, normalizer=None) -> (scalar loss, dict of float metrics with "actor/" keys).
All tensors are [batch, tokens]: logprobs = log p_theta of the sampled token (carries the
gradient), old_logprobs = log p_dense_old (the dense policy before the update),
actor_logprobs = log p_actor (the sparse rollout), advantages per token (per_token_advantages
spreads per-sample ones), mask = generated tokens. old, actor and advantages are treated as
constants. normalizer: see aggregate.py (micro-batching). Formulas: docs/rl.md.

Departure from the method's loss (docs/method.md), for numerical safety only: the log ratio is
clamped to [-20, 20] before exp (a ratio of e^20 is clipped anyway).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sparrow.registry import Registry
from sparrow.rl.aggregate import AGGREGATIONS, aggregate, masked_mean
from sparrow.rl.checks import RLInputError, as_bool_mask, check_same_2d

if TYPE_CHECKING:
    from sparrow.config.schema import AlgoConfig

PolicyLoss = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class PolicyLossConfig:
    """The loss settings, named as in AlgoConfig. tis_cap < 0 turns TIS off (weight 1).
    mis_cap .. geo_high: the masking losses' thresholds (losses_masked.py, algo.correction)."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0
    loss_agg: str = "token_mean"
    mis_cap: float = 2.0
    icepop_low: float = 0.5
    icepop_high: float = 5.0
    geo_low: float = 0.99
    geo_high: float = 1.01

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise RLInputError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if not self.eps_high >= 0:
            raise RLInputError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.tis_cap == 0 or math.isnan(self.tis_cap):
            raise RLInputError(
                f"tis_cap must be > 0 (the TIS cap C) or negative (TIS off), got {self.tis_cap}"
            )
        if self.loss_agg not in AGGREGATIONS:
            raise RLInputError(
                f"loss_agg {self.loss_agg!r} is unknown; valid: {', '.join(AGGREGATIONS)}"
            )
        for low, high in (("icepop_low", "icepop_high"), ("geo_low", "geo_high")):
            if not 0 <= getattr(self, low) <= getattr(self, high):
                raise RLInputError(
                    f"{low} and {high} must satisfy 0 <= low <= high, got "
                    f"{getattr(self, low)} and {getattr(self, high)}"
                )
        if not self.mis_cap > 0:
            raise RLInputError(f"mis_cap must be > 0, got {self.mis_cap}")

    @property
    def tis_enabled(self) -> bool:
        return self.tis_cap > 0

    @classmethod
    def from_algo(cls, algo: AlgoConfig) -> PolicyLossConfig:
        correction = getattr(algo, "correction", None)
        thresholds = (
            {}
            if correction is None
            else {
                name: getattr(correction, name)
                for name in ("mis_cap", "icepop_low", "icepop_high", "geo_low", "geo_high")
            }
        )
        return cls(
            eps_low=algo.eps_low,
            eps_high=algo.eps_high,
            tis_cap=algo.tis_cap,
            loss_agg=algo.loss_agg,
            **thresholds,
        )


def tis_weights(
    old_logprobs: torch.Tensor, actor_logprobs: torch.Tensor, mask: torch.Tensor, tis_cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, truncated): w = min(p_dense_old / p_actor, C), detached, 1 off the mask or with TIS
    off; truncated marks masked tokens whose untruncated weight reached C."""
    mask = as_bool_mask(mask)
    dtype = _compute_dtype(old_logprobs)
    if tis_cap < 0:
        return torch.ones_like(old_logprobs, dtype=dtype), torch.zeros_like(mask)
    log_w = old_logprobs.detach().to(dtype) - actor_logprobs.detach().to(dtype)
    log_w = torch.where(mask, log_w, torch.zeros_like(log_w))
    log_cap = math.log(tis_cap)
    weight = torch.exp(torch.clamp(log_w, max=log_cap))
    return weight, mask & (log_w >= log_cap)


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 stays float64; anything narrower (bf16 logprobs) is computed in float32."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def clipped_surrogate(logprobs, old_logprobs, actor_logprobs, advantages, mask, cfg):
    """The checked inputs and the PPO clipped surrogate every policy loss here weighs:
    (bool mask, old logprobs, advantages, clamped log ratio, min(ratio A, clip(ratio) A)),
    in the compute dtype, zero off the mask."""
    check_same_2d(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        actor_logprobs=actor_logprobs,
        advantages=advantages,
        mask=mask,
    )
    if not isinstance(cfg, PolicyLossConfig):
        raise RLInputError(f"cfg must be a PolicyLossConfig, got {type(cfg).__name__}")
    mask = as_bool_mask(mask)
    dtype = _compute_dtype(logprobs)
    old = old_logprobs.detach().to(dtype)
    # off-mask entries may hold padding (even -inf): zero them before they meet any arithmetic
    adv = torch.where(mask, advantages.detach().to(dtype), torch.zeros_like(old))
    log_ratio = torch.where(mask, logprobs.to(dtype) - old, torch.zeros_like(old))
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    return mask, old, adv, log_ratio, torch.minimum(ratio * adv, clipped * adv)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    actor_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
    *,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-w * min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A), ratio = p_theta / p_old."""
    mask, old, adv, log_ratio, surrogate = clipped_surrogate(
        logprobs, old_logprobs, actor_logprobs, advantages, mask, cfg
    )
    weight, truncated = tis_weights(old, actor_logprobs, mask, cfg.tis_cap)
    loss = aggregate(-weight * surrogate, mask, cfg.loss_agg, normalizer)
    with torch.no_grad():
        metrics = _metrics(loss, log_ratio, adv, weight, truncated, old, actor_logprobs, mask, cfg)
    return loss, metrics


def _metrics(loss, log_ratio, adv, weight, truncated, old, actor_logprobs, mask, cfg):
    ratio = torch.exp(log_ratio)
    clip_high = (adv > 0) & (ratio > 1 + cfg.eps_high)
    clip_low = (adv < 0) & (ratio < 1 - cfg.eps_low)
    # k3 estimator (r - 1) - log r: per token >= 0, unbiased for KL when sampled from the
    # denominator's distribution
    approx_kl = (ratio - 1) - log_ratio
    log_mismatch = torch.where(
        mask, old - actor_logprobs.detach().to(old.dtype), torch.zeros_like(old)
    )
    log_mismatch = log_mismatch.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    mismatch_kl = torch.exp(log_mismatch) - 1 - log_mismatch
    return {
        "actor/pg_loss": float(loss.detach()),
        "actor/clip_frac": masked_mean(clip_high | clip_low, mask),
        "actor/clip_frac_high": masked_mean(clip_high, mask),
        "actor/clip_frac_low": masked_mean(clip_low, mask),
        "actor/ratio_mean": masked_mean(ratio, mask),
        "actor/approx_kl": masked_mean(approx_kl, mask),
        "actor/tis_weight_mean": masked_mean(weight, mask),
        "actor/tis_truncated_frac": masked_mean(truncated, mask),
        "actor/mismatch_kl": masked_mean(mismatch_kl, mask),
        "actor/tokens": float(mask.sum()),
    }
