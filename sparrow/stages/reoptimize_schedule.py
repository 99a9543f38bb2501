"""Stage 5, reoptimize_schedule: the online controller. Raise bins that crossed below target,
lower bins with margin on a timer, each change a new schedule version.

    outcome = reoptimize_schedule_task(workdir, run_id, step)   # .../reoptimize_schedule/decision.json

Each step, sparrow/control/controller.py reads the run's per-bin history of
schedule.target_statistic (bin_stats; p5 by default, sparrow/sparse/target.py) against
schedule.target: a bin below target - control.tolerance for control.patience steps
in a row is raised; every pipeline.reoptimize_every steps (0: never) bins whose p5 is at least
target + control.margin try fewer pages. The bins concerned are re-measured exactly on this
step's own trajectories (rollouts.parquet; the control.remeasure_samples longest, 0: all),
teacher-forced under the policy that sampled them. With control.confirm_raise (the default) a
raise is first measured at the bin's current top-k and dropped when the exact value there
meets the target: the history is the top-k lower bound of acceptance, which a broad
next-token distribution holds low at any budget (reoptimize/raises_unconfirmed counts the
dropped ones, decision.json's reasons name them). Then at the grid budgets above (raise) or below
(lower) their current top-k (the grid is calibrate.topk_pages, else the one `sparrow calibrate`
would use), measuring only those sparrow/control/grid_search.py needs to find the
smallest one meeting the target (the exhaustive pick when p5 is monotone in the budget). A
changed schedule is stored as the next version of the run's schedule name (schedules row with
this step, reason and YAML path), so the rollout stage of the next step decodes with it
(sparrow/runtime/ledger/schedules.py), and MLflow gets the schedule, a tag `schedule.change.step<n>` and metrics
reoptimize/raised, reoptimize/lowered, reoptimize/topk_measured and
reoptimize/trajectories_replayed. decision.json holds the decision, the measured p5 and the
changes. A bin below target that already reads the grid's largest budget cannot be raised:
the target is out of reach there (the run decodes that bin at its most expensive); the first
step this happens to a bin records a threshold_events row of kind grid_top and an MLflow tag
`schedule.grid_top.bin<b>`, and every such step counts it in reoptimize/bins_at_grid_top and
decision.json's at_grid_top. With algo.distill.switch_to_cheaper, when no bin is to be raised, the DistillSparse
rule (sparrow/runtime/distill_switch.py) may instead switch every bin one notch cheaper, measured with
the LoRA by earlier distill steps: kind "distill" changes, threshold_events rows of kind
distill_switch, metric reoptimize/distill_switch, tag distill.switch.step<n>. With
schedule.sparse=false the stage only records that nothing is to be done.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from sparrow.control.calibration import Trajectory, measure_topk_pages, topk_grid
from sparrow.control.controller import (
    Change,
    ControlSettings,
    Decision,
    apply_measurement,
    candidate_topk_pages,
    confirm_raises,
    decide,
)
from sparrow.control.grid_search import search_topk_pages
from sparrow.data.rollouts import read_rollouts
from sparrow.runtime.distill_switch import EVENT_KIND, switch_for
from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.schedules import insert_schedule, schedule_in_force
from sparrow.runtime.ledger.stage import StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.run_runtime import RunRuntime, device_and_dtype, lookup
from sparrow.sparse.io import save_schedule_yaml
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import get_statistic
from sparrow.storage.mismatch_rows import add_threshold_events, event_bins, statistic_history
from sparrow.storage.schedule_rows import newest_version

GRID_TOP_KIND = "grid_top"
SWITCH_REASON = "distill: the LoRA held the target on the cheaper schedule"
STAGE = contract.DECISION.stage


def settings_of(cfg) -> ControlSettings:
    """The controller's settings; its target on the statistic's higher-is-better axis."""
    target = get_statistic(cfg.schedule.target_statistic).oriented(cfg.schedule.target)
    return ControlSettings(
        target=target,
        tolerance=cfg.control.tolerance,
        patience=cfg.control.patience,
        margin=cfg.control.margin,
    )


def p5_history(runtime: RunRuntime, step: int) -> dict[int, dict[int, float]]:
    """step -> {bin: value} of schedule.target_statistic (p5 by default), oriented."""
    statistic = get_statistic(runtime.cfg.schedule.target_statistic)
    column = statistic.column  # a registry entry's column (storage checks it too)
    with runtime.store.connect() as conn:
        rows = statistic_history(conn, runtime.run_id, column, step)
    history: dict[int, dict[int, float]] = {}
    for s, b, value in rows:
        history.setdefault(int(s), {})[int(b)] = float(statistic.oriented(value))
    return history


def step_trajectories(runtime: RunRuntime, step: int) -> list[Trajectory]:
    records = read_rollouts(contract.ROLLOUTS.at(runtime.layout, step))
    return [
        Trajectory(tuple(r.prompt_ids) + tuple(r.output_ids), len(r.prompt_ids))
        for r in records
        if r.output_ids
    ]


def longest(trajectories: list[Trajectory], count: int) -> list[Trajectory]:
    """The `count` longest (0: all), ties in rollout order: a bin concerned is often a late
    one that only long trajectories reach, and an empty bin could not be re-measured."""
    if count < 0:
        raise ValueError(f"control.remeasure_samples must be >= 0, got {count}")
    if not count or count >= len(trajectories):
        return list(trajectories)
    order = sorted(range(len(trajectories)), key=lambda i: -len(trajectories[i].ids))
    return [trajectories[i] for i in sorted(order[:count])]


def remeasure(
    runtime: RunRuntime, step: int, schedule: Schedule, decision: Decision
) -> tuple[Decision, list[int], np.ndarray, list[int], int, list[int]]:
    """(the decision, its raises confirmed; topk_pages, p5[topk index, bin], tokens per bin,
    trajectories replayed, the grid): the decision's bins, exact, on the longest
    control.remeasure_samples of this step's trajectories, at the top-k values grid_search
    needs; "p5" is schedule.target_statistic, oriented. With control.confirm_raise a raise
    is first re-measured at the bin's current top-k and dropped when it meets the target
    there (controller.confirm_raises)."""
    import torch

    from sparrow.model import load_model

    cfg = runtime.cfg
    trajectories = longest(step_trajectories(runtime, step), cfg.control.remeasure_samples)
    grid = list(cfg.calibrate.topk_pages) or list(
        topk_grid(-(-max(len(t.ids) for t in trajectories) // schedule.page_size))
    )
    statistic = get_statistic(cfg.schedule.target_statistic)
    tokens: list[int] = []
    models: list = []

    def measure(topk_pages: list[int]) -> np.ndarray:
        if not models:  # loaded on the first probe: a bin at the grid's end needs none
            device, dtype = device_and_dtype(cfg.model)
            models.append(
                load_model(runtime.policy_folder_before(step), getattr(torch, dtype), device)
            )
        table = measure_topk_pages(
            models[0],
            trajectories,
            schedule,
            topk_pages,
            cfg.rollout.temperature or 1.0,
            num_bins=schedule.num_bins,
            bins=decision.raise_bins + decision.lower_bins,
            centroid_dtype=cfg.rollout.centroid_dtype,
        )
        tokens[:] = [int(n) for n in table.tokens]
        return statistic.oriented(table.statistic(statistic.name))[:, : schedule.num_bins]

    target = settings_of(cfg).target
    known: dict[int, np.ndarray] = {}
    if cfg.control.confirm_raise and decision.raise_bins:
        current = sorted({schedule.topk_pages[b] for b in decision.raise_bins})
        known = dict(zip(current, measure(current)))
        at_current = {}
        for b in decision.raise_bins:
            row = known[schedule.topk_pages[b]]
            at_current[b] = float(row[b]) if b < row.size else math.nan
        decision = confirm_raises(decision, schedule, at_current, target)
    topk_pages, measured = search_topk_pages(schedule, decision, grid, measure, target, known)
    return decision, topk_pages, measured, tokens, len(trajectories) if topk_pages else 0, grid


def reoptimize(runtime: RunRuntime, step: int, out: Path) -> StageWrite:
    cfg = runtime.cfg
    schedule, version = schedule_in_force(
        runtime.store, runtime.run_id, runtime.schedule_name, runtime.schedule_start_version, step
    )
    every = cfg.pipeline.reoptimize_every
    decision, switch = Decision(step), None
    if cfg.schedule.sparse:
        decision = decide(
            p5_history(runtime, step),
            step,
            schedule,
            settings_of(cfg),
            lowering_due=bool(every and step % every == 0),
        )
        if not decision.raise_bins:  # a bin below target comes first
            switch = switch_for(runtime, step, schedule, settings_of(cfg))
    topk_pages, p5, changes, new, replayed, grid = [], np.zeros((0, 0)), [], schedule, 0, []
    unconfirmed = 0
    if switch is not None:
        new, changes = switch
        decision = Decision(step, reasons=(SWITCH_REASON,))
    elif decision.any:
        triggered = decision.raise_bins
        decision, topk_pages, p5, tokens, replayed, grid = remeasure(
            runtime, step, schedule, decision
        )
        unconfirmed = len(triggered) - len(decision.raise_bins)
        new, changes = apply_measurement(
            schedule, decision, topk_pages, p5, settings_of(cfg), tokens
        )
        if triggered and not decision.raise_bins:  # no raise confirmed: as if none was due
            switch = switch_for(runtime, step, schedule, settings_of(cfg))
            if switch is not None:
                new, changes = switch
                decision = Decision(step, reasons=(*decision.reasons, SWITCH_REASON))
    at_grid_top = [
        b
        for b in decision.raise_bins
        if switch is None and not candidate_topk_pages(schedule, b, grid, "raise")
    ]
    record = {
        "step": step,
        "schedule": schedule.name,
        "version": version,
        "decision": asdict(decision),
        "topk_measured": topk_pages,
        "at_grid_top": at_grid_top,
        "p5": [[None if np.isnan(v) else float(v) for v in row] for row in p5],
        "changes": [{**asdict(c), "p5": None if np.isnan(c.p5) else c.p5} for c in changes],
        "topk_pages": list(new.topk_pages),
        "trajectories_replayed": replayed,
    }
    metrics = {
        "reoptimize/due": float(decision.any),
        "reoptimize/raised": float(sum(c.kind == "raise" for c in changes)),
        "reoptimize/lowered": float(sum(c.kind == "lower" for c in changes)),
        "reoptimize/topk_measured": float(len(topk_pages)),
        "reoptimize/trajectories_replayed": float(replayed),
        "reoptimize/distill_switch": float(switch is not None),
        "reoptimize/bins_at_grid_top": float(len(at_grid_top)),
        "reoptimize/raises_unconfirmed": float(unconfirmed),
    }
    if not changes:
        contract.write_json(contract.DECISION.under(out), record)
        write = StageWrite(metrics=metrics)
    else:
        write = _new_version(runtime, step, out, new, changes, record, metrics)
    return _with_grid_top(runtime, step, schedule, at_grid_top, write)


def _with_grid_top(
    runtime: RunRuntime, step: int, schedule: Schedule, bins: list[int], write: StageWrite
) -> StageWrite:
    """The stage's write plus, for bins at the grid's top for the first time in the run, a
    grid_top event and an MLflow tag."""
    if not bins:
        return write
    with runtime.store.connect() as conn:
        seen = event_bins(conn, runtime.run_id, GRID_TOP_KIND, step)
    first = [b for b in bins if b not in seen]
    if not first:
        return write
    p5_now = p5_history(runtime, step).get(step, {})
    target = settings_of(runtime.cfg).target
    db_before, after_before = write.db, write.after_commit

    def db(conn) -> None:
        if db_before is not None:
            db_before(conn)
        add_threshold_events(
            conn, runtime.run_id, step, [(b, GRID_TOP_KIND, p5_now.get(b), target) for b in first]
        )

    def after_commit(final: Path) -> None:
        if after_before is not None:
            after_before(final)
        tracker = runtime.tracker
        if tracker is None:
            return
        for b in first:
            p5 = p5_now.get(b)
            tracker.client.set_tag(
                tracker.mlflow_run_id,
                f"schedule.grid_top.bin{b}",
                f"step {step}: {runtime.cfg.schedule.target_statistic} "
                f"{'?' if p5 is None else f'{p5:.4f}'} < target {target} at "
                f"{schedule.topk_pages[min(b, schedule.num_bins - 1)]} pages, the grid's largest",
            )

    return StageWrite(metrics=write.metrics, db=db, after_commit=after_commit)


def _new_version(
    runtime: RunRuntime,
    step: int,
    out: Path,
    new: Schedule,
    changes: list[Change],
    record: dict,
    metrics: dict,
) -> StageWrite:
    with runtime.store.connect() as conn:
        version = (newest_version(conn, new.name) or 0) + 1
    save_schedule_yaml(new, contract.NEW_SCHEDULE.under(out))
    final_yaml = contract.NEW_SCHEDULE.at(runtime.layout, step)
    reason = "; ".join(f"bin {c.bin} {c.kind} {c.old_topk}->{c.new_topk}" for c in changes)
    record.update(new_version=version, reason=reason)
    contract.write_json(contract.DECISION.under(out), record)

    switched = [c for c in changes if c.kind == "distill"]
    target = settings_of(runtime.cfg).target

    def db(conn) -> None:
        insert_schedule(conn, new, version, runtime.run_id, step, reason, str(final_yaml))
        # one event per bin, as the threshold crossings are recorded
        add_threshold_events(
            conn,
            runtime.run_id,
            step,
            [(c.bin, EVENT_KIND, None if np.isnan(c.p5) else c.p5, target) for c in switched],
        )

    def after_commit(final: Path) -> None:
        tracker = runtime.tracker
        if tracker is None:
            return
        tracker.log_schedule(new, version, step)
        tracker.client.set_tag(
            tracker.mlflow_run_id, f"schedule.change.step{step}", f"v{version}: {reason}"
        )
        if switched:
            tracker.client.set_tag(
                tracker.mlflow_run_id,
                f"distill.switch.step{step}",
                f"v{version}: {list(new.topk_pages)}",
            )

    metrics["reoptimize/new_version"] = float(version)
    return StageWrite(metrics=metrics, db=db, after_commit=after_commit)


@task(name="reoptimize_schedule", cache_policy=NONE, **INFRA_RETRIES)
def reoptimize_schedule_task(workdir: str, run_id: str, step: int) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, STAGE, step, lambda out: reoptimize(runtime, step, out))
