"""RL mathematics: advantage estimators and policy losses, each in a registry.

    from sparrow.rl import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, PolicyLossConfig

The registries are filled by the modules that define their entries (advantages.py,
losses.py, losses_masked.py) and re-exported here; the config loader checks algo.advantage
and algo.loss against them. The math is written out in docs/rl.md.
"""

from sparrow.rl import losses_masked  # noqa: F401,E402 - registers the masking losses
from sparrow.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    per_token_advantages,
    rloo_advantages,
)
from sparrow.rl.aggregate import AGGREGATIONS, aggregate, count_for, masked_mean
from sparrow.rl.checks import RLInputError
from sparrow.rl.losses import POLICY_LOSSES, PolicyLossConfig, ppo_clip_loss, tis_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "PolicyLossConfig",
    "RLInputError",
    "aggregate",
    "count_for",
    "grpo_advantages",
    "masked_mean",
    "per_token_advantages",
    "ppo_clip_loss",
    "rloo_advantages",
    "tis_weights",
]
