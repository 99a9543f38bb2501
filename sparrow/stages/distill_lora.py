"""Stage 7, distill_lora (algo.distill.enabled): the sparse actor's LoRA after the policy update.

    outcome = distill_lora_task(workdir, run_id, step, rollout_dir, rewards_path, policy_dir)
    outcome.output_dir   # adapter.safetensors, adapter.json, distill_optimizer.pt, distill_state.json

The distiller (sparrow/trainer/distill.py) takes the policy after this step's update as its
frozen base (the in-memory trainer's weights, else the policy_update folder's), then, on steps
that are multiples of algo.distill.every, one LoRA step on the step's rollouts under the schedule
the rollout used (its schedule.json). Every step's folder holds the adapter and the LoRA's AdamW
state, so it is the resume point: a resumed run loads the distiller from the newest recorded
distill_lora folder before the step (or starts a fresh adapter, seeded by pipeline.seed), and
sync_weights hands the folder to the rollout engines, which load merge(base, LoRA). The trainer
and the dense scorer never see the adapter. With algo.distill.switch_to_cheaper the step also
measures the LoRA under a schedule one notch cheaper (cheaper.json, sparrow/runtime/distill_switch.py),
which reoptimize_schedule reads to decide a switch. Between steps the distiller stays in the
runtime; while the engines roll out, its base weights are freed (release_during_rollout).
With a trainer group (trainer.num_workers > 0) the step runs on the group's ranks, each holding
the distiller beside its trainer shards (sparrow/runtime/trainer_group/distill.py); the folder is the same.
Metrics ("distill/...": loss, divergences, exact acceptance mean / p5 / lowest per-bin p5
with and without the LoRA on the same tokens) go to DuckDB and MLflow as step metrics.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.errors import SparrowError
from sparrow.runtime.distill_switch import cheaper_candidate, write_measurement
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import (
    CachedDistiller,
    RunRuntime,
    device_and_dtype,
    lookup,
    peak_memory,
)
from sparrow.storage.run_rows import stage_records

STAGE = "distill_lora"


class DistillNeedsSparseError(SparrowError):
    """algo.distill.enabled with dense rollout: there is no sparse actor to distill."""


def adapter_folder_before(runtime: RunRuntime, step: int) -> str:
    """The newest recorded distill_lora folder before `step`, "" if none."""
    folders = [
        r.output_dir
        for r in stage_records(runtime.store, runtime.run_id)
        if r.stage == STAGE and r.step < step
    ]
    return folders[-1] if folders else ""


def _distiller_before(runtime: RunRuntime, step: int):
    from sparrow.trainer.distill import SparseDistiller

    cached, runtime.distiller = runtime.distiller, None
    trainer = runtime.trainer_before(step + 1) if runtime.cfg.trainer.num_workers else None
    group = trainer if trainer is not None and trainer.sharded else None
    # a group's distiller lives on its ranks: a restarted group starts one from the folder
    if (
        cached is not None
        and cached.step == step - 1
        and getattr(cached.distiller, "group", None) is group
    ):
        return cached.distiller
    cfg = runtime.cfg
    device, dtype = device_and_dtype(cfg.model)
    options = dict(
        temperature=cfg.rollout.temperature or 1.0, centroid_dtype=cfg.rollout.centroid_dtype
    )
    distiller_options = dict(options, trainer_config=cfg.trainer)
    folder = adapter_folder_before(runtime, step)
    if group is not None:  # the ranks' own distillers (sparrow/runtime/trainer_group/distill.py)
        from sparrow.runtime.trainer_group.distill import DistillSpec, GroupDistiller

        return GroupDistiller.start(group, DistillSpec(folder, cfg.pipeline.seed, **options))
    if folder:
        return SparseDistiller.load(
            folder, runtime.model_path, cfg.algo, device, dtype, **distiller_options
        )
    return SparseDistiller(
        runtime.model_path, cfg.algo, device, dtype, cfg.pipeline.seed, **distiller_options
    )


def _base_weights(runtime: RunRuntime, step: int, policy_dir: str):
    trainer = runtime.trainer_after(step)
    if trainer is not None:
        trainer.onload()
        return trainer.state_dict_for_sync()
    from sparrow.model.loader import SafetensorsCheckpoint

    return SafetensorsCheckpoint(policy_dir)


def _inputs(rollout_dir: str, rewards_path: str, runtime: RunRuntime):
    from sparrow.trainer.distill import record_advantages

    records = contract.read_rollouts(rollout_dir)
    used = contract.read_rollout_schedule(rollout_dir)
    if not used.sparse:
        raise DistillNeedsSparseError(
            "algo.distill.enabled needs sparse rollout "
            "(schedule.sparse=true): the dense actor has no mismatch"
        )
    advantages = None
    if runtime.cfg.algo.distill.ppo_coef > 0:
        rewards = contract.read_rewards(rewards_path, records)
        advantages = record_advantages(
            records, rewards, runtime.cfg.rollout.samples_per_prompt, runtime.cfg.algo
        )
    return records, used.schedule, advantages


def distill_step(
    runtime: RunRuntime, step: int, rollout_dir: str, rewards_path: str, policy_dir: str, out: Path
) -> StageWrite:
    settings = runtime.cfg.algo.distill
    due = step % settings.every == 0
    records, schedule, advantages = _inputs(rollout_dir, rewards_path, runtime)
    distiller = _distiller_before(runtime, step)  # out of the cache: mid-update from here on
    metrics: dict[str, float] = {"distill/due": float(due)}
    cheaper = (
        cheaper_candidate(runtime.cfg, schedule) if due and settings.switch_to_cheaper else None
    )
    if due:
        with peak_memory() as peak:
            clock = time.perf_counter()
            if not runtime.cfg.trainer.num_workers:  # a group's ranks read their own shards
                distiller.set_base(_base_weights(runtime, step, policy_dir))
            metrics.update(distiller.distill(records, schedule, advantages, cheaper=cheaper))
            metrics["time/distill_compute_s"] = time.perf_counter() - clock
        metrics.update(peak("memory/distill_peak_gib"))
    if cheaper is not None and "cheaper" in distiller.bin_stats:
        write_measurement(
            out,
            step,
            schedule,
            cheaper,
            distiller.bin_stats["cheaper"],
            runtime.cfg.schedule.target_statistic,
        )
    distiller.save(out)

    def after_commit(final: Path) -> None:
        runtime.distiller = CachedDistiller(step, distiller)

    return StageWrite(metrics=metrics, after_commit=after_commit)


@task(name=STAGE, cache_policy=NONE, **INFRA_RETRIES)
def distill_lora_task(
    workdir: str, run_id: str, step: int, rollout_dir: str, rewards_path: str, policy_dir: str
) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime,
        STAGE,
        step,
        lambda out: distill_step(runtime, step, rollout_dir, rewards_path, policy_dir, out),
    )
