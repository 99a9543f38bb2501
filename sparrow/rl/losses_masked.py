"""Mismatch corrections that mask instead of truncate, in the policy-loss registry.

    loss, metrics = POLICY_LOSSES.get("icepop")(logprobs, old, actor, advantages, mask, cfg)

The same signature and PPO clipped surrogate as ppo_clip (losses.py); only the per-token
weight on the surrogate changes. With rho_t = p_dense_old(y_t) / p_actor(y_t):
- ppo_clip (TIS, the method's): w_t = min(rho_t, tis_cap).
- mis_token (masked IS, token level): w_t = rho_t if rho_t <= mis_cap, else 0.
- mis_sequence (masked IS, sequence level): rho_s = prod_t rho_t over the sequence's tokens;
  every token gets w = rho_s if rho_s <= mis_cap, else 0.
- icepop (IcePop's two-sided token masking): w_t = rho_t if icepop_low <= rho_t <= icepop_high,
  else 0.
- geo_mask (geometric sequence mask): g = exp(mean_t log rho_t); a sequence with
  geo_low <= g <= geo_high keeps TIS weights min(rho_t, tis_cap) (1 with TIS off), any other
  sequence gets 0 on every token.
A masked token still counts in the loss's denominator (aggregate.py's normalizer is the whole
batch's generated tokens, so micro-batching keeps giving the full batch's gradient); masking
zeroes its contribution only. docs/rl.md compares them with TIS; tests compare each with a
plain loop (tests/rl/test_masked_losses.py).
"""

from __future__ import annotations

import math

import torch

from sparrow.rl.aggregate import aggregate, masked_mean
from sparrow.rl.losses import POLICY_LOSSES, _metrics, clipped_surrogate, tis_weights


def _log_rho(old: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(p_old / p_actor) per token, 0 off the mask (padding may hold anything there)."""
    log_rho = old - actor.detach().to(old.dtype)
    return torch.where(mask, log_rho, torch.zeros_like(log_rho))


def _token_band(log_rho: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """rho where low <= rho <= high, else 0."""
    log_low = math.log(low) if low > 0 else -math.inf
    kept = (log_rho >= log_low) & (log_rho <= math.log(high))
    return torch.where(
        kept, torch.exp(log_rho.clamp(max=math.log(high))), torch.zeros_like(log_rho)
    )


def _mis_token(old, actor, mask, cfg):
    return _token_band(_log_rho(old, actor, mask), 0.0, cfg.mis_cap)


def _mis_sequence(old, actor, mask, cfg):
    log_seq = _log_rho(old, actor, mask).sum(dim=1, keepdim=True)
    weight = _token_band(log_seq, 0.0, cfg.mis_cap)
    return weight.expand_as(old)


def _icepop(old, actor, mask, cfg):
    return _token_band(_log_rho(old, actor, mask), cfg.icepop_low, cfg.icepop_high)


def _geo_mask(old, actor, mask, cfg):
    log_rho = _log_rho(old, actor, mask)
    tokens = mask.sum(dim=1, keepdim=True).clamp(min=1).to(old.dtype)
    log_geo = log_rho.sum(dim=1, keepdim=True) / tokens
    log_low = math.log(cfg.geo_low) if cfg.geo_low > 0 else -math.inf
    kept = (log_geo >= log_low) & (log_geo <= math.log(cfg.geo_high))
    tis, _ = tis_weights(old, actor, mask, cfg.tis_cap)
    return torch.where(kept, tis.to(old.dtype), torch.zeros_like(tis, dtype=old.dtype))


_WEIGHTS = {
    "mis_token": _mis_token,
    "mis_sequence": _mis_sequence,
    "icepop": _icepop,
    "geo_mask": _geo_mask,
}


def _masked_loss(name: str):
    weigh = _WEIGHTS[name]

    def loss_fn(logprobs, old_logprobs, actor_logprobs, advantages, mask, cfg, *, normalizer=None):
        mask, old, adv, log_ratio, surrogate = clipped_surrogate(
            logprobs, old_logprobs, actor_logprobs, advantages, mask, cfg
        )
        weight = weigh(old, actor_logprobs, mask, cfg).detach()
        loss = aggregate(-weight * surrogate, mask, cfg.loss_agg, normalizer)
        with torch.no_grad():
            masked = mask & (weight == 0)
            metrics = _metrics(
                loss, log_ratio, adv, weight, torch.zeros_like(mask), old, actor_logprobs, mask, cfg
            )
            metrics["actor/is_masked_frac"] = masked_mean(masked, mask)
        return loss, metrics

    loss_fn.__name__ = f"{name}_loss"
    loss_fn.__doc__ = f"PPO clipped surrogate with the {name} weights (module doc)."
    return loss_fn


for _name in _WEIGHTS:
    POLICY_LOSSES.register(_name)(_masked_loss(_name))
