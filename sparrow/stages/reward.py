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
rewards.parquet has one row per sample, in the rollout file's order: prompt_index,
sample_index, reward.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.reward_routing import score_samples
from sparrow.data.reward_runner import RewardBatch
from sparrow.data.rollouts import read_rollouts
from sparrow.errors import SparrowError
from sparrow.rl.overlong import overlong_penalties
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup

REWARDS_FILE = "rewards.parquet"
SUMMARY_FILE = "summary.json"


class RewardErrorsError(SparrowError):
    """Too many of a step's reward calls raised (data.reward_max_error_share)."""


def write_rewards(
    path: Path, prompt_index: list[int], sample_index: list[int], rewards: list[float]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "prompt_index": pa.array(prompt_index, pa.int32()),
            "sample_index": pa.array(sample_index, pa.int32()),
            "reward": pa.array(rewards, pa.float64()),
        }
    )
    pq.write_table(table, path)


def read_rewards(path: str | Path) -> list[float]:
    import pyarrow.parquet as pq

    return [float(v) for v in pq.read_table(path, columns=["reward"]).column("reward").to_pylist()]


def score_records(cfg, records) -> tuple[RewardBatch, list[float]]:
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


def score_rollouts(runtime: RunRuntime, rollouts_path: str, out: Path) -> StageWrite:
    data = runtime.cfg.data
    records = read_rollouts(rollouts_path)
    batch, shaped = score_records(runtime.cfg, records)
    write_rewards(
        out / REWARDS_FILE,
        [r.prompt_index for r in records],
        [r.sample_index for r in records],
        shaped,
    )
    (out / SUMMARY_FILE).write_text(
        json.dumps(
            {
                "reward": data.reward,
                "samples": len(records),
                "errors": batch.errors,
                "timeouts": batch.timeouts,
                "first_error": batch.first_error,
                "first_traceback": batch.first_traceback,
            },
            indent=2,
        )
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
