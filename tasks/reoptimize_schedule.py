"""Stage 5, reoptimize_schedule: decide whether the schedule should be re-optimized.

    outcome = reoptimize_schedule_task(workdir, run_id, step)   # .../reoptimize_schedule/decision.json

A re-optimization is due when this step recorded a `below_target` threshold event, or every
`pipeline.reoptimize_every` steps (0: never on a timer). For now the stage only records the
decision (decision.json and the step metric reoptimize/due); re-measuring and storing a new
schedule version (tasks/schedules.py insert_schedule, Tracker.log_schedule) is the
calibration issue's part, and the rollout stage already decodes with the newest version
stored before its step.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from tasks.retry import INFRA_RETRIES
from tasks.runtime import RunRuntime, lookup
from tasks.stage import StageOutcome, StageWrite, run_stage

DECISION_FILE = "decision.json"


def decide(runtime: RunRuntime, step: int, out: Path) -> StageWrite:
    with runtime.store.connect() as conn:
        bins = [b for (b,) in conn.execute(
            "SELECT bin FROM threshold_events WHERE run_id = ? AND step = ? AND kind = "
            "'below_target' ORDER BY bin", [runtime.run_id, step]).fetchall()]
    every = runtime.cfg.pipeline.reoptimize_every
    reasons = []
    if bins:
        reasons.append(f"p5 below target {runtime.cfg.schedule.target} in bins {bins}")
    if every and step % every == 0:
        reasons.append(f"every {every} steps")
    decision = {"step": step, "due": bool(reasons), "reasons": reasons, "bins_below": bins,
                "schedule": runtime.schedule_name, "action": "recorded only"}
    (out / DECISION_FILE).write_text(json.dumps(decision, indent=2))
    return StageWrite(metrics={"reoptimize/due": float(bool(reasons))})


@task(name="reoptimize_schedule", cache_policy=NONE, **INFRA_RETRIES)
def reoptimize_schedule_task(workdir: str, run_id: str, step: int) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(runtime, "reoptimize_schedule", step, lambda out: decide(runtime, step, out))
