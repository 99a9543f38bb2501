"""The train flow: RL steps of sparse rollout, dense scoring and policy update, resumable.

    sparrow train pipeline.steps=2 data.prompts_per_step=2 rollout.samples_per_prompt=2
    python -c "from sparrow.flows.train import train_flow; train_flow(['pipeline.steps=2'])"

train_flow(overrides) resolves the config, opens the run (sparrow/flows/train_setup.py: inputs
checked, workdir locked, `runs` row created or resumed, MLflow run, Ray and rollout actors),
then runs each step as the subflow rl_step: the stage tasks of sparrow/stages/ in the step's order (docs/architecture.md)
(rollout, reward, with pipeline.max_staleness=1 the start of the next step's rollout
(docs/async.md), dense_score, aggregate_mismatch, reoptimize_schedule, policy_update,
distill_lora when algo.distill.enabled, sync_weights, then checkpoint every
pipeline.checkpoint_every steps and after the last, and evaluate every pipeline.eval_every steps when data.eval is set). Tasks pass references (paths)
only. After each step it prints a row of the live table; at the end it writes the run's
report (pipeline.report) and prints where to look.
Running it again with the same pipeline.run_id skips every recorded stage and resumes at the
first missing one. Without a Prefect server it runs on Prefect's local ephemeral API
(sparrow/flows/prefect_env.py). docs/pipeline.md describes stages, files and resume.
"""

from __future__ import annotations

import sys

from sparrow.flows.prefect_env import quiet_prefect

quiet_prefect()

from prefect import flow  # noqa: E402
from rich.console import Console  # noqa: E402

from sparrow.config import load_config  # noqa: E402
from sparrow.cuda_memory import frozen_heap  # noqa: E402
from sparrow.flows.live_table import LiveTable  # noqa: E402
from sparrow.flows.train_setup import (
    close_run_runtime,
    open_run_runtime,
    where_to_look,
    with_run_id,
)  # noqa: E402
from sparrow.runtime import interrupt  # noqa: E402
from sparrow.runtime.ledger import contract  # noqa: E402
from sparrow.stages.aggregate_mismatch import aggregate_mismatch_task  # noqa: E402
from sparrow.stages.checkpoint import checkpoint_task  # noqa: E402
from sparrow.stages.dense_score import dense_score_task  # noqa: E402
from sparrow.stages.distill_lora import distill_lora_task  # noqa: E402
from sparrow.stages.evaluate import evaluate_task  # noqa: E402
from sparrow.stages.policy_update import policy_update_task  # noqa: E402
from sparrow.stages.reoptimize_schedule import reoptimize_schedule_task  # noqa: E402
from sparrow.stages.reward import reward_task  # noqa: E402
from sparrow.stages.rollout import launch_rollout_task, rollout_task  # noqa: E402
from sparrow.stages.sync_weights import sync_weights_task  # noqa: E402
from sparrow.storage.run_rows import stage_records, step_metrics  # noqa: E402


@flow(name="rl-step")
def rl_step(
    workdir: str,
    run_id: str,
    step: int,
    checkpoint: bool,
    evaluate: bool,
    distill: bool = False,
    one_step_off: bool = False,
) -> dict:
    """One RL step; {stage: True if it was skipped as already recorded}. One-step-off: the
    next step's rollout starts once this step's rewards are in (docs/async.md)."""
    rollout = rollout_task(workdir, run_id, step)
    rollouts = str(contract.ROLLOUTS.under(rollout.output_dir))
    reward = reward_task(workdir, run_id, step, rollouts)
    if one_step_off:
        launch_rollout_task(workdir, run_id, step + 1)
    scores = dense_score_task(workdir, run_id, step, rollouts)
    scores_path = str(contract.SCORES.under(scores.output_dir))
    rewards_path = str(contract.REWARDS.under(reward.output_dir))
    aggregate = aggregate_mismatch_task(workdir, run_id, step, rollout.output_dir, scores_path)
    decision = reoptimize_schedule_task(workdir, run_id, step)
    update = policy_update_task(workdir, run_id, step, rollouts, rewards_path, scores_path)
    outcomes = [rollout, reward, scores, aggregate, decision, update]
    adapter_dir = ""
    if distill:  # DistillSparse: the sparse actor's LoRA, merged into the engines' weights only
        lora = distill_lora_task(
            workdir,
            run_id,
            step,
            rollout.output_dir,
            rewards_path,
            update.output_dir,
        )
        outcomes.append(lora)
        adapter_dir = lora.output_dir
    outcomes.append(sync_weights_task(workdir, run_id, step, update.output_dir, adapter_dir))
    if checkpoint:
        outcomes.append(checkpoint_task(workdir, run_id, step, update.output_dir, adapter_dir))
    if evaluate:
        outcomes.append(evaluate_task(workdir, run_id, step))
    return {outcome.stage: outcome.skipped for outcome in outcomes}


def _due(step: int, every: int, last: int, at_end: bool) -> bool:
    return bool(every and step % every == 0) or (at_end and step == last)


def _log_report(runtime, workdir: str, run_id: str) -> None:
    """The run's plots and one-page summary, into the run folder and the MLflow run."""
    from sparrow.reports.run import make_report

    for path in make_report(workdir, run_id, runtime.layout.run_dir / "report"):
        runtime.tracker.log_artifact(path, subdir="plots")


def _no_heartbeat():
    """Settings under which a step's subflow sends no heartbeats. Prefect joins a flow run's
    heartbeat thread when the run ends, and the thread sleeps in 1 s steps, so each step's
    subflow waited 0.5 s on average (a step's wall clock came in whole seconds on a CPU). The
    train flow itself keeps its heartbeat: a server that watches for crashed runs sees the run
    stop when the step inside it stops."""
    from prefect.settings import temporary_settings

    return temporary_settings(updates={"flows.heartbeat_frequency": None})


@flow(name="train")
def train_flow(overrides: list[str], show_table: bool = True) -> dict:
    """Run (or resume) a training run; a small summary of what it did and where it lives."""
    cfg = with_run_id(load_config(overrides))
    # rich assumes 80 columns when piped; a log should keep the table's rows whole
    console = Console(quiet=not show_table, width=None if sys.stdout.isatty() else 200)
    table = LiveTable(console)
    table.header()  # at once: opening the run and starting the actors takes a while
    # the run's collections (return_cached_blocks at each hand-over) skip the imports
    with frozen_heap():
        runtime, resumed, started_ray = open_run_runtime(cfg)
        workdir, run_id, steps = cfg.pipeline.workdir, runtime.run_id, cfg.pipeline.steps
        status, skipped = "failed", {}
        try:
            for step in range(1, steps + 1):
                with _no_heartbeat():
                    skipped[step] = rl_step(
                        workdir,
                        run_id,
                        step,
                        checkpoint=_due(step, cfg.pipeline.checkpoint_every, steps, at_end=True),
                        evaluate=bool(cfg.data.eval)
                        and _due(step, cfg.pipeline.eval_every, steps, False),
                        distill=cfg.algo.distill.enabled,
                        one_step_off=cfg.pipeline.max_staleness > 0,
                    )
                table.row(
                    step, step_metrics(runtime.store, run_id, step), all(skipped[step].values())
                )
            status = "finished"
            final = step_metrics(runtime.store, run_id, steps) if steps else {}
            if steps and cfg.pipeline.report:
                _log_report(runtime, workdir, run_id)
            recorded = len(stage_records(runtime.store, run_id))
        except KeyboardInterrupt:
            status = "interrupted"  # Ctrl-C: resumable like a failure, and shown as what it was
            raise
        except Exception as err:
            if not interrupt.requested():
                raise
            # a Ctrl-C that a library turned into an error of its own (DuckDB's "Query
            # interrupted", a task's failure): still the user's Ctrl-C
            status = "interrupted"
            raise KeyboardInterrupt from err
        finally:
            close_run_runtime(runtime, status)
            if started_ray:
                import ray

                ray.shutdown()
    for line in where_to_look(runtime):
        console.print(line, highlight=False, soft_wrap=True)
    return {
        "run_id": run_id,
        "workdir": str(workdir),
        "status": status,
        "resumed": resumed,
        "steps": steps,
        "stages_recorded": recorded,
        "stages_run": dict(runtime.stages_run),
        "stages_skipped": sum(s for step in skipped.values() for s in step.values()),
        "mlflow_run_id": runtime.tracker.mlflow_run_id,
        "final_metrics": final,
    }
