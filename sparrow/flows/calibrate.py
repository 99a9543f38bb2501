"""The calibrate flow: find a sparsity schedule for a model by measurement, in one command.

    sparrow calibrate calibrate.num_prompts=4 calibrate.repeats=2
    python -c "from sparrow.flows.calibrate import calibrate_flow; calibrate_flow(['calibrate.repeats=2'])"

Same `model.*` and `pipeline.workdir` keys as train; schedule.name is the template (page size,
bins, reserved pages, dense layers) and schedule.target the p5 to meet. Tasks (sparrow/stages/calibrate.py,
sparrow/stages/calibrate_store.py): sample trajectories on the calibration prompts (densely, and with
calibrate.sample_sparse, the default, by the sparse actor under every budget of the grid);
replay them teacher-forced (each budget on its own samples, or the dense ones under every
budget), exact acceptance per token; optionally time generating every budget the paper's
way (calibrate.time_generation=true); choose the cheapest monotone schedule by the cost model
and store it (YAML, DuckDB `calibration` and `schedules`, MLflow, plot). Returns the summary;
train uses the schedule with `schedule.name=<its name>`. docs/calibration.md explains it.
"""

from __future__ import annotations

import secrets
import time

from sparrow.flows.prefect_env import quiet_prefect

quiet_prefect()

from prefect import flow  # noqa: E402

from sparrow.config import load_config  # noqa: E402
from sparrow.flows.progress import PhaseProgress  # noqa: E402
from sparrow.stages.calibrate import replay_task, sample_task, time_generation_task  # noqa: E402
from sparrow.stages.calibrate_store import choose_task  # noqa: E402


def new_calibration_id() -> str:
    return f"cal-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@flow(name="calibrate")
def calibrate_flow(overrides: list[str], calibration_id: str = "", progress: bool = False) -> dict:
    """Calibrate a schedule; a summary (schedule name, version, top-k per bin, timings, paths).
    progress: a line on stderr as each phase starts and ends (sparrow/flows/progress.py)."""
    cfg = load_config(overrides)  # a bad key fails here, before any task
    calibration_id = calibration_id or new_calibration_id()
    timed = cfg.calibrate.time_generation
    phases = PhaseProgress(4 if timed else 3, quiet=not progress)
    with phases.phase("sampling trajectories (dense, and under each top-k of the grid)"):
        trajectories = sample_task(overrides, calibration_id)
    with phases.phase("replaying them teacher-forced under each top-k"):
        table = replay_task(overrides, calibration_id, trajectories)
    timing = None
    if timed:
        with phases.phase("timing generation under every budget"):
            timing = time_generation_task(overrides, calibration_id, table)
    with phases.phase("choosing and storing the schedule"):
        return choose_task(overrides, calibration_id, trajectories, table, timing)
