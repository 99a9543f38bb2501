"""Stage 2, reward: score every sample's completion against its prompt's answer.

    outcome = reward_task(workdir, run_id, step, rollouts_path)   # step-<n>/reward/rewards.parquet

The reward function is `data.reward` (a registry name, module:function or
path/to/file.py:function; docs/rewards.md), or the one data.reward_by_source routes the
sample's data_source to, plus algo's overlong shaping (sparrow/rl/overlong.py), run by sparrow.data.reward_runner under
`data.reward_timeout_s` per call: a call that raises, returns no number or runs too long
scores 0 and is counted (reward/errors, reward/timeouts in step_metrics, MLflow and the live
table; the first failure's message and traceback in summary.json). When more than
`data.reward_max_error_share` of the step's samples raised, the step fails with
RewardErrorsError naming the function and the first traceback: a reward function that is
broken should stop a run, not train it on zeros. A resume re-runs the step's reward stage.
rewards.parquet (sparrow/runtime/ledger/contract.py) has one row per sample, in the rollout
file's order: prompt_index, sample_index, reward.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.rollouts import read_rollouts
from sparrow.data.step_rewards import score_records
from sparrow.errors import SparrowError
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup


class RewardErrorsError(SparrowError):
    """Too many of a step's reward calls raised (data.reward_max_error_share)."""


def score_rollouts(runtime: RunRuntime, rollouts_path: str, out: Path) -> StageWrite:
    data = runtime.cfg.data
    records = read_rollouts(rollouts_path)
    batch, shaped = score_records(runtime.cfg, records)
    contract.write_rewards(
        contract.REWARDS.under(out),
        [r.prompt_index for r in records],
        [r.sample_index for r in records],
        shaped,
    )
    contract.write_json(
        contract.REWARD_SUMMARY.under(out),
        {
            "reward": data.reward,
            "samples": len(records),
            "errors": batch.errors,
            "timeouts": batch.timeouts,
            "first_error": batch.first_error,
            "first_traceback": batch.first_traceback,
        },
    )
    check_error_share(data.reward, batch, len(records), data.reward_max_error_share)
    rewards = np.asarray(shaped, dtype=np.float64)
    penalty = rewards - np.asarray(batch.rewards, dtype=np.float64)
    return StageWrite(
        metrics={
            "reward/mean": float(rewards.mean()) if rewards.size else float("nan"),
            "reward/std": float(rewards.std()) if rewards.size else float("nan"),
            "reward/overlong_penalty_mean": float(penalty.mean()) if rewards.size else 0.0,
            "reward/errors": float(batch.errors),
            "reward/timeouts": float(batch.timeouts),
        }
    )


def check_error_share(name: str, batch, samples: int, max_share: float) -> None:
    """RewardErrorsError when more than max_share of the samples' reward calls raised."""
    if samples == 0 or batch.errors <= max_share * samples:
        return
    raise RewardErrorsError(
        f"reward function {name!r} raised on {batch.errors} of {samples} samples, more than "
        f"data.reward_max_error_share={max_share:g} of them; each scored 0. Fix the function "
        f"(or raise data.reward_max_error_share) and resume. The first sample that raised:\n"
        f"{(batch.first_traceback or batch.first_error or '').rstrip()}"
    )


@task(name="reward", cache_policy=NONE, **INFRA_RETRIES)
def reward_task(workdir: str, run_id: str, step: int, rollouts_path: str) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime, "reward", step, lambda out: score_rollouts(runtime, rollouts_path, out)
    )
