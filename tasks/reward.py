"""Stage 2, reward: score every sample's completion against its prompt's answer.

    outcome = reward_task(workdir, run_id, step, rollouts_path)   # step-<n>/reward/rewards.parquet

The reward function is `data.reward` (registry REWARD_FUNCTIONS), run by
sparrow_core.data.reward_runner under `data.reward_timeout_s` per call: a call that raises,
returns no number or runs too long scores 0 and is counted (reward/errors, reward/timeouts in
step_metrics; the first failure's message in summary.json), and never fails the step.
rewards.parquet has one row per sample, in the rollout file's order: prompt_index,
sample_index, reward.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow_core.data.reward_runner import score_completions
from sparrow_core.data.rollouts import read_rollouts
from tasks.retry import INFRA_RETRIES
from tasks.runtime import RunRuntime, lookup
from tasks.stage import StageOutcome, StageWrite, run_stage

REWARDS_FILE = "rewards.parquet"
SUMMARY_FILE = "summary.json"


def write_rewards(path: Path, prompt_index: list[int], sample_index: list[int],
                  rewards: list[float]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt_index": pa.array(prompt_index, pa.int32()),
                      "sample_index": pa.array(sample_index, pa.int32()),
                      "reward": pa.array(rewards, pa.float64())})
    pq.write_table(table, path)


def read_rewards(path: str | Path) -> list[float]:
    import pyarrow.parquet as pq

    return [float(v) for v in pq.read_table(path, columns=["reward"]).column("reward").to_pylist()]


def score_rollouts(runtime: RunRuntime, rollouts_path: str, out: Path) -> StageWrite:
    data = runtime.cfg.data
    records = read_rollouts(rollouts_path)
    batch = score_completions(data.reward, [r.text for r in records], [r.answer for r in records],
                              timeout_s=data.reward_timeout_s)
    write_rewards(out / REWARDS_FILE, [r.prompt_index for r in records],
                  [r.sample_index for r in records], batch.rewards)
    (out / SUMMARY_FILE).write_text(json.dumps(
        {"reward": data.reward, "samples": len(records), "errors": batch.errors,
         "timeouts": batch.timeouts, "first_error": batch.first_error}, indent=2))
    rewards = np.asarray(batch.rewards, dtype=np.float64)
    return StageWrite(metrics={
        "reward/mean": float(rewards.mean()) if rewards.size else float("nan"),
        "reward/std": float(rewards.std()) if rewards.size else float("nan"),
        "reward/errors": float(batch.errors),
        "reward/timeouts": float(batch.timeouts),
    })


@task(name="reward", cache_policy=NONE, **INFRA_RETRIES)
def reward_task(workdir: str, run_id: str, step: int, rollouts_path: str) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, "reward", step,
                     lambda out: score_rollouts(runtime, rollouts_path, out))
