"""The calibrate flow's last task: choose the schedule and store it everywhere it is read.

    summary = choose_task(overrides, calibration_id, trajectories_path, table_path, timing)

Prices every (budget, bin) with the cost model (model shape from the checkpoint's config.json,
calibrate.hardware, the calibration prompts' median length), chooses the cheapest monotone
schedule whose lower confidence bound of schedule.target_statistic (p5 by default), fitted
monotone in the budget, meets schedule.target in every bin at the floor
(calibrate.min_bin_tokens and min_bin_samples; sparrow/control/choose.py), then writes: the
schedule YAML `<workdir>/schedules/<name>-v<version>.yaml`; in DuckDB one transaction with the
`calibration` rows (p1, p5, p10, mean with their bounds, tokens, trajectories, counted and the
estimator "exact" per budget and bin) and a new `schedules` version;
the plot and summary.json under `<workdir>/calibrations/<id>/`; and an MLflow run tagged
with the calibration id holding the schedule, the plot, the table and the timings.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.config import SparrowConfig, load_config
from sparrow.control.acceptance_table import AcceptanceTable
from sparrow.control.calibration import model_shape
from sparrow.control.choose import Choice, choose_topk_pages, topk_cost_table
from sparrow.costmodel import get_hardware
from sparrow.mismatch.acceptance import EXACT, BinFloor
from sparrow.model.builtin import resolve_model_path
from sparrow.reports.calibration_plot import plot_calibration
from sparrow.runtime.ledger.calibration_files import (
    CALIBRATION_PLOT,
    CALIBRATION_SUMMARY,
    calibration_dir,
    read_trajectories,
    table_from_dict,
    write_json,
)
from sparrow.runtime.ledger.schedules import insert_schedule
from sparrow.sparse.io import resolve_schedule, save_schedule_yaml
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import get_statistic
from sparrow.storage import Store
from sparrow.storage.schedule_rows import newest_version, replace_calibration


def schedule_name(cfg: SparrowConfig, model_dir: Path) -> str:
    return cfg.calibrate.name or f"calibrated-{model_dir.name}-{cfg.schedule.target:g}"


def choose(cfg: SparrowConfig, table: AcceptanceTable, prompt_len: int, model_dir: Path) -> Choice:
    template = resolve_schedule(cfg.schedule.name)
    cost = topk_cost_table(
        table.topk_pages,
        table.num_bins,
        template,
        model=model_shape(model_dir),
        hardware=get_hardware(cfg.calibrate.hardware),
        prompt_len=prompt_len,
    )
    # schedule.target_statistic (p5 by default) on its higher-is-better axis, as the chooser reads
    # it; its bound on the failing side where the table has bounds (one written before: the value)
    statistic = get_statistic(cfg.schedule.target_statistic)
    return choose_topk_pages(
        table.topk_pages,
        statistic.oriented(table.statistic(statistic.name)),
        table.tokens,
        cost,
        statistic.oriented(cfg.schedule.target),
        cfg.calibrate.min_bin_tokens,
        lower=table.conservative(statistic.name),
        samples=table.samples,
        min_samples=cfg.calibrate.min_bin_samples,
    )


def bin_floor(cfg: SparrowConfig) -> BinFloor:
    return BinFloor(cfg.calibrate.min_bin_tokens, cfg.calibrate.min_bin_samples)


def store_calibration(
    cfg: SparrowConfig,
    calibration_id: str,
    table: AcceptanceTable,
    schedule: Schedule,
    model_dir: Path,
) -> tuple[int, Path]:
    """(version, yaml path): calibration rows and the new schedules version, in one transaction."""
    workdir = Path(cfg.pipeline.workdir)
    # a few seconds' write: wait out another calibration (or a study's planning) doing its own
    with Store.open_writer(workdir, wait_s=120.0) as store, store.connect() as conn:
        version = (newest_version(conn, schedule.name) or 0) + 1
        yaml_path = save_schedule_yaml(
            schedule, workdir / "schedules" / f"{schedule.name}-v{version}.yaml"
        )
        replace_calibration(conn, calibration_id, str(model_dir), table.rows(bin_floor(cfg)))
        insert_schedule(
            conn,
            schedule,
            version,
            calibration_id,
            0,
            f"calibration {calibration_id}",
            str(yaml_path),
        )
    return version, yaml_path


def track(
    cfg: SparrowConfig,
    calibration_id: str,
    schedule: Schedule,
    version: int,
    files: list[Path],
    metrics: dict,
) -> str:
    from sparrow.runtime.tracking import Tracker

    tracker = Tracker.start(cfg, calibration_id, cfg.pipeline.workdir)
    tracker.log_schedule(schedule, version, step=0)
    for path in files:
        tracker.log_artifact(path, subdir="calibration")
    tracker.log_step(0, metrics)
    tracker.end("finished")
    return tracker.mlflow_run_id


def choose_and_store(
    overrides: list[str],
    calibration_id: str,
    trajectories_path: str,
    table_path: str,
    timing: dict | None = None,
) -> dict:
    cfg = load_config(overrides)
    model_dir = resolve_model_path(cfg.model.path)
    trajectories, sampled = read_trajectories(trajectories_path)
    table_data = json.loads(Path(table_path).read_text())
    table = table_from_dict(table_data)
    prompt_len = int(statistics.median(t.prompt_len for t in trajectories))
    choice = choose(cfg, table, prompt_len, model_dir)
    template, name = resolve_schedule(cfg.schedule.name), schedule_name(cfg, model_dir)
    notes = choice.notes()
    schedule = dataclasses.replace(
        template,
        name=name,
        topk_pages=choice.topk_pages,
        target=cfg.schedule.target,
        description=f"calibrated ({calibration_id}) on {model_dir.name} from {template.name}"
        + (f"; {'; '.join(notes)}" if notes else ""),
    )
    version, yaml_path = store_calibration(cfg, calibration_id, table, schedule, model_dir)
    folder = calibration_dir(cfg.pipeline.workdir, calibration_id)
    plot = plot_calibration(
        table,
        choice,
        cfg.schedule.target,
        folder / CALIBRATION_PLOT,
        title=f"{name} v{version}: p5 per bin for every budget",
    )
    calibration_s = sampled["sample_s"] + table_data["replay_s"]
    summary = {
        "calibration_id": calibration_id,
        "schedule": name,
        "version": version,
        "topk_pages": list(choice.topk_pages),
        "target": cfg.schedule.target,
        "topk_grid": list(table.topk_pages),
        "tokens_per_bin": [int(n) for n in table.tokens],
        "samples_per_bin": None if table.samples is None else [int(n) for n in table.samples],
        # the monotone fit of the bound (or value) the choice read, per bin at its budget
        "fitted_at_choice": [None if b.fitted != b.fitted else b.fitted for b in choice.bins],
        "chosen_by": "lower confidence bound" if table.bounds else "point estimate",
        "estimator": EXACT,
        "notes": notes,
        "yaml": str(yaml_path),
        "plot": str(plot),
        "trajectories": len(trajectories),
        "sample_s": sampled["sample_s"],
        "replay_s": table_data["replay_s"],
        "calibration_s": calibration_s,
        **(timing or {}),
    }
    if timing:
        summary["generation_over_calibration"] = timing["generation_s"] / calibration_s
    summary_path = write_json(folder / CALIBRATION_SUMMARY, summary)
    metrics = {
        f"calibration/{k}": summary[k]
        for k in ("sample_s", "replay_s", "calibration_s", "generation_s")
        if k in summary
    }
    summary["mlflow_run_id"] = track(
        cfg, calibration_id, schedule, version, [plot, Path(table_path), summary_path], metrics
    )
    return summary


@task(name="calibrate-choose", cache_policy=NONE)
def choose_task(
    overrides: list[str],
    calibration_id: str,
    trajectories_path: str,
    table_path: str,
    timing: dict | None = None,
) -> dict:
    return choose_and_store(overrides, calibration_id, trajectories_path, table_path, timing)
