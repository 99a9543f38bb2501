"""A step's rewards: each sample scored by its data_source's reward, then the overlong shaping.

    batch, shaped = score_records(cfg, records)   # RewardBatch, rewards with shaping added

What the reward stage writes and what dynamic sampling judges a draw by: the same function,
so a kept group is kept for the rewards the update then sees (docs/rl.md, DAPO).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparrow.data.reward_routing import score_samples
from sparrow.data.reward_runner import RewardBatch
from sparrow.rl.overlong import overlong_penalties

if TYPE_CHECKING:
    from sparrow.config.schema import SparrowConfig
    from sparrow.data.rollouts import RolloutRecord


def score_records(
    cfg: SparrowConfig, records: Sequence[RolloutRecord]
) -> tuple[RewardBatch, list[float]]:
    """(the reward functions' batch, the rewards with algo's overlong shaping added): each
    sample by its data_source's reward (sparrow/data/reward_routing.py)."""
    data, algo = cfg.data, cfg.algo
    batch = score_samples(
        data.reward,
        data.reward_by_source,
        [r.text for r in records],
        [r.answer for r in records],
        [r.data_source for r in records],
        [r.extra_info for r in records],
        timeout_s=data.reward_timeout_s,
        format_reward=data.format_reward,
    )
    shaping = overlong_penalties(
        [len(r.output_ids) for r in records],
        cfg.rollout.max_new_tokens,
        min(algo.overlong_buffer, cfg.rollout.max_new_tokens),
        algo.overlong_penalty,
    )
    return batch, [r + float(p) for r, p in zip(batch.rewards, shaping)]
