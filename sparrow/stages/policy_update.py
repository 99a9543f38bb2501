"""Stage 6, policy_update: the GRPO/PPO step on the step's rollouts, then save the policy.

    outcome = policy_update_task(workdir, run_id, step, rollouts_path, rewards_path, scores_path)

PolicyTrainer.update takes the rollouts, their rewards, and the dense logprobs of
dense_score as the old logprobs (group size rollout.samples_per_prompt); the updated policy
is saved (PolicyTrainer.save: safetensors, config, optimizer state) into this stage's
folder, which is the resume point: a resumed run loads the trainer from the newest recorded
policy_update folder, and sync_weights points the rollout actors at it. The trainer's
metrics (loss, clip and TIS fractions, KL, grad norm) become step metrics.
"""

from __future__ import annotations

import math
import numbers
import shutil
import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.data.rollouts import read_rollouts
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.retention import prune_policy_folders
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, lookup, peak_memory


def numeric_metrics(metrics: dict) -> dict[str, float]:
    """The trainer's numbers (tensors and numpy scalars included), other values dropped."""
    out = {}
    for name, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[str(name)] = float(value) if math.isfinite(value) else float("nan")
    return out


def update_step(
    runtime: RunRuntime,
    step: int,
    rollouts_path: str,
    rewards_path: str,
    scores_path: str,
    out: Path,
) -> StageWrite:
    records = read_rollouts(rollouts_path)
    rewards = contract.read_rewards(rewards_path, records)
    old_logprobs = contract.read_scores(scores_path, records)["dense_logprobs"]
    trainer = runtime.trainer_before(step)
    # the in-memory trainer is mid-update from here on: a failure must not leave it in use
    runtime.set_trainer(None, -1)
    with peak_memory() as peak:
        clock = time.perf_counter()
        metrics = trainer.update(
            records, rewards, old_logprobs, runtime.cfg.rollout.samples_per_prompt
        )
        metrics["time/update_compute_s"] = time.perf_counter() - clock
    trainer.free_gradients()
    clock = time.perf_counter()
    if runtime.cfg.pipeline.background_save and trainer.device.type == "cuda":
        # the ~20 GB write overlaps the next rollout; the stage folder points to it
        state_dir = contract.policy_state_dir(runtime.layout, step)
        shutil.rmtree(state_dir, ignore_errors=True)  # left by an attempt that was not recorded
        trainer.save_in_background(state_dir)
        runtime.remember_save(trainer)
        contract.write_policy_pointer(out, state_dir)
    else:
        trainer.save(out)
    metrics["time/update_save_s"] = time.perf_counter() - clock
    metrics.update(peak("memory/update_peak_gib"))

    def after_commit(final: Path) -> None:
        runtime.set_trainer(trainer, step)
        prune_policy_folders(runtime, step)

    return StageWrite(metrics=numeric_metrics(metrics), after_commit=after_commit)


@task(name="policy_update", cache_policy=NONE, **INFRA_RETRIES)
def policy_update_task(
    workdir: str, run_id: str, step: int, rollouts_path: str, rewards_path: str, scores_path: str
) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime,
        "policy_update",
        step,
        lambda out: update_step(runtime, step, rollouts_path, rewards_path, scores_path, out),
    )
