"""DistillSparse's switch to a cheaper schedule (algo.distill.switch_to_cheaper): what the
distill_lora stage measures and what reoptimize_schedule reads to decide.

    cheaper = cheaper_candidate(cfg, schedule)         # distill_lora, on a due step
    write_measurement(out, step, schedule, cheaper, distiller.bin_stats["cheaper"], cfg)
    switch = switch_for(runtime, step, schedule, settings)   # reoptimize_schedule: None or
    new, changes = switch                                      # (schedule, changes)

The candidate is the schedule the step rolled out with, every bin one budget of the
controller's grid lower (calibrate.topk_pages, else calibration's grid for the schedule's
largest budget, so it does not move from step to step). The distill stage replays the
step's trajectories with the LoRA under it (SparseDistiller.distill(cheaper=...)) and writes
the per-bin target statistic (schedule.target_statistic, oriented) to cheaper.json in its
folder (contract.CHEAPER). reoptimize_schedule reads the recorded distill_lora folders before
its step and asks
sparrow/control/controller.distill_switch whether the last algo.distill.switch_patience
of them, all of the schedule in force and of one candidate, held it at schedule.target +
algo.distill.switch_margin. A switch is a new schedule version like any other change, with
one threshold_events row per changed bin (kind distill_switch, p5 column: the lowest value
measured there) and an MLflow tag distill.switch.step<n>.
"""

from __future__ import annotations

from pathlib import Path

from sparrow.control.calibration import topk_grid
from sparrow.control.controller import (
    CheaperMeasurement,
    ControlSettings,
    distill_switch,
    one_notch_cheaper,
)
from sparrow.runtime.ledger import contract
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import get_statistic
from sparrow.storage.run_rows import stage_records

DISTILL_STAGE = contract.CHEAPER.stage
EVENT_KIND = "distill_switch"


def cheaper_candidate(cfg, schedule: Schedule) -> Schedule | None:
    """One notch cheaper than `schedule` (None when no bin can go lower)."""
    # the listed grid, unrefined: a notch is one of the paper's (or the small grid's) steps
    grid = list(cfg.calibrate.topk_pages) or topk_grid(
        max(2, max(schedule.topk_pages) + 1), max_step=None
    )
    cheaper = one_notch_cheaper(schedule, grid)
    return None if cheaper.topk_pages == schedule.topk_pages else cheaper


def write_measurement(
    out: Path, step: int, schedule: Schedule, cheaper: Schedule, stats, statistic_name: str
) -> Path:
    """cheaper.json: the schedules' top-k and the statistic per bin of `stats` (BinStats)."""
    statistic = get_statistic(statistic_name)
    values = {str(s.bin): float(statistic.oriented(getattr(s, statistic.column))) for s in stats}
    return contract.write_cheaper(
        out, step, statistic.name, schedule.topk_pages, cheaper.topk_pages, values
    )


def read_measurements(runtime, step: int) -> list[CheaperMeasurement]:
    """The recorded distill_lora measurements before `step` of the configured statistic."""
    name = get_statistic(runtime.cfg.schedule.target_statistic).name
    out = []
    for record in stage_records(runtime.store, runtime.run_id):
        if record.stage != DISTILL_STAGE or record.step >= step:
            continue
        data = contract.read_cheaper(record.output_dir)
        if data is not None and data["statistic"] == name:
            out.append(
                CheaperMeasurement(
                    int(data["step"]),
                    tuple(data["schedule_topk"]),
                    tuple(data["cheaper_topk"]),
                    {int(b): float(v) for b, v in data["values"].items()},
                )
            )
    return out


def switch_for(runtime, step: int, schedule: Schedule, settings: ControlSettings):
    """(cheaper schedule, changes) when the controller may switch at `step`, else None."""
    distill = runtime.cfg.algo.distill
    if not (distill.enabled and distill.switch_to_cheaper):
        return None
    return distill_switch(
        read_measurements(runtime, step),
        schedule,
        settings,
        distill.switch_patience,
        distill.switch_margin,
    )
