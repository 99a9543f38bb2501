"""The stability study flow: one train run per arm from the same start and seeds, resumable.

    sparrow study run s1 pipeline.steps=8                  # sparrow/conf/study/default.yaml's arms
    sparrow study run s1 --arm dense pipeline.steps=8      # only this arm (several --arm allowed)
    sparrow study run s1 --gpus 0,1,2,3 study.own_workdirs=true pipeline.steps=8   # at once
    python -c "from sparrow.flows.study import study_flow; study_flow('s1', overrides=[])"

study_flow plans the arms (sparrow/stages/study_arms.py: every arm's config checked, its schedule pinned,
the study_arms rows written), then runs each arm that is not finished (or, given `arms`, each
of those) as the train flow, a subflow, with run id `<study_id>-<arm>`; at the end it writes
the study report (sparrow/reports/study.py) into `<workdir>/studies/<study_id>/report/`. Running
it again with the same study id skips the finished arms and resumes an unfinished one through
the train flow's own resume (same run id: its recorded stages are not run again). An arm that
fails stops the study; the arms after it run on the next call. Ray is started once for all
arms that run.

study_at_once runs the arms at the same time, one process per GPU (`sparrow study run ...
--gpus 0,1,2,3`): each process is `sparrow study run <id> --arm <arm>` with
CUDA_VISIBLE_DEVICES set to its GPU, its own local Ray and (without PREFECT_API_URL) its own
temporary Prefect API; more arms than GPUs wait for the next free GPU. The arms need their own
workdirs (`study.own_workdirs=true`), since a workdir has one writer. Each process's output
goes to `<workdir>/studies/<study_id>/arms/<arm>.log`; the report is written when all are done.
docs/study-tool.md describes the arms, the report and how to read it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparrow.flows.prefect_env import quiet_prefect

quiet_prefect()

from prefect import flow  # noqa: E402

from sparrow.config import ConfigError  # noqa: E402
from sparrow.config.study import check_arm_names, check_at_once, load_study  # noqa: E402
from sparrow.flows.train import train_flow  # noqa: E402
from sparrow.reports.study import default_out, write_study_report  # noqa: E402
from sparrow.runtime.rollout.actors import start_ray  # noqa: E402
from sparrow.stages.study_arms import own_workdir, plan_study, plan_study_task, study_dir  # noqa: E402
from sparrow.stages.study_report import study_report_task  # noqa: E402


def _selected(
    study: str, study_overrides: list[str] | None, plans: list[dict], arms: list[str] | None
) -> list[dict]:
    if not arms:
        return plans
    check_arm_names(load_study(study, study_overrides or []), arms)
    return [plan for plan in plans if plan["arm"] in arms]


@flow(name="study")
def study_flow(
    study_id: str,
    study: str = "default",
    overrides: list[str] | None = None,
    study_overrides: list[str] | None = None,
    show_table: bool = False,
    arms: list[str] | None = None,
) -> dict:
    """Run (or resume) every arm of a study, or the named `arms` alone (then no report); a
    small summary of what ran and where."""
    plans = plan_study_task(study_id, study, list(study_overrides or []), list(overrides or []))
    chosen = _selected(study, study_overrides, plans, arms)
    pending = [plan for plan in chosen if not plan["finished"]]
    started_ray = bool(pending) and start_ray(plans[0]["ray_address"])
    ran = []
    try:
        for plan in chosen:
            if plan["finished"]:
                ran.append(
                    {
                        "arm": plan["arm"],
                        "run_id": plan["run_id"],
                        "status": "finished",
                        "skipped": True,
                        "resumed": False,
                    }
                )
                continue
            summary = train_flow(plan["overrides"], show_table=show_table)
            ran.append(
                {
                    "arm": plan["arm"],
                    "run_id": plan["run_id"],
                    "status": summary["status"],
                    "skipped": False,
                    "resumed": summary["resumed"],
                }
            )
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    workdir = plans[0]["workdir"]
    # the named arms alone may run beside the others (study_at_once): the report comes after
    report = None if arms else study_report_task(workdir, study_id)
    return {"study_id": study_id, "workdir": str(workdir), "arms": ran, "report": report}


def arm_command(study_id: str, study: str, arm: str, items: list[str]) -> list[str]:
    """The command line of one arm's process (items: train and study.KEY=VALUE overrides)."""
    return [
        sys.executable,
        "-m",
        "sparrow.cli.main",
        "study",
        "run",
        study_id,
        "--study",
        study,
        "--arm",
        arm,
        "--json",
        *items,
    ]


def arm_environment(gpu: str, arm_dir: Path) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, PYTHONUNBUFFERED="1")
    if not env.get("PREFECT_API_URL"):  # each process its own temporary API and database
        env["PREFECT_HOME"] = str(arm_dir / "prefect-home")
    return env


def study_at_once(
    study_id: str,
    study: str,
    overrides: list[str],
    study_overrides: list[str],
    gpus: list[str],
    poll_s: float = 1.0,
) -> dict:
    """Run the unfinished arms at once, one process per GPU in `gpus`, then the report; a
    summary like study_flow's, with each arm's exit code and log."""
    if not gpus:
        raise ConfigError("--gpus names no GPU")
    check_at_once(load_study(study, study_overrides))
    plans = plan_study(study_id, study, study_overrides, overrides)
    workdir = plans[0]["workdir"]
    items = [*overrides, *(f"study.{item}" for item in study_overrides)]
    waiting = [plan for plan in plans if not plan["finished"]]
    results = {
        plan["arm"]: {
            "arm": plan["arm"],
            "run_id": plan["run_id"],
            "status": "finished",
            "skipped": True,
            "resumed": False,
        }
        for plan in plans
        if plan["finished"]
    }
    # one slot per entry of gpus (a GPU named twice runs two arms)
    running: dict[int, tuple[subprocess.Popen, dict, Path, object]] = {}
    free = list(range(len(gpus)))
    try:
        while waiting or running:
            while waiting and free:
                plan, slot = waiting.pop(0), free.pop(0)
                arm_dir = own_workdir(workdir, study_id, plan["arm"])
                arm_dir.mkdir(parents=True, exist_ok=True)
                log_path = study_dir(workdir, study_id) / "arms" / f"{plan['arm']}.log"
                log = open(log_path, "ab")
                proc = subprocess.Popen(
                    arm_command(study_id, study, plan["arm"], items),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=arm_environment(gpus[slot], arm_dir),
                )
                running[slot] = (proc, plan, log_path, log)
            time.sleep(poll_s)
            for slot, (proc, plan, log_path, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[slot]
                free.append(slot)
                results[plan["arm"]] = {
                    "arm": plan["arm"],
                    "run_id": plan["run_id"],
                    "skipped": False,
                    "status": "finished" if proc.returncode == 0 else "failed",
                    "returncode": proc.returncode,
                    "gpu": gpus[slot],
                    "log": str(log_path),
                }
    except BaseException:
        for proc, _, _, _ in running.values():  # a Ctrl-C stops every arm as it stops one
            proc.send_signal(signal.SIGINT)
        for proc, _, _, log in running.values():
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        raise
    arms = [results[plan["arm"]] for plan in plans]
    out = default_out(workdir, study_id)
    write_study_report(workdir, study_id, out)
    return {"study_id": study_id, "workdir": str(workdir), "arms": arms, "report": str(out)}
