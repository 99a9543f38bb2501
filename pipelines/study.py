"""The stability study flow: one train run per arm from the same start and seeds, resumable.

    sparrow study run s1 pipeline.steps=8                  # conf/study/default.yaml's arms
    python -c "from pipelines.study import study_flow; study_flow('s1', overrides=[])"

study_flow plans the arms (tasks/study_arms.py: every arm's config checked, its schedule pinned,
the study_arms rows written), then runs each arm that is not finished as the train flow, a
subflow, with run id `<study_id>-<arm>`; at the end it writes the study report
(tasks/study_report.py) into `<workdir>/studies/<study_id>/report/`. Running it again with the
same study id skips the finished arms and resumes an unfinished one through the train flow's
own resume (same run id: its recorded stages are not run again). An arm that fails stops the
study; the arms after it run on the next call. Ray is started once for all arms that run.
docs/study.md describes the arms, the report and how to read it.
"""

from __future__ import annotations

from pipelines.prefect_env import quiet_prefect

quiet_prefect()

from prefect import flow  # noqa: E402

from pipelines.train import train_flow  # noqa: E402
from runtime.rollout_actors import start_ray  # noqa: E402
from tasks.study_arms import plan_study_task  # noqa: E402
from tasks.study_report import study_report_task  # noqa: E402


@flow(name="study")
def study_flow(study_id: str, study: str = "default", overrides: list[str] | None = None,
               study_overrides: list[str] | None = None, show_table: bool = False) -> dict:
    """Run (or resume) every arm of a study; a small summary of what ran and where."""
    plans = plan_study_task(study_id, study, list(study_overrides or []), list(overrides or []))
    pending = [plan for plan in plans if not plan["finished"]]
    started_ray = bool(pending) and start_ray(plans[0]["ray_address"])
    arms = []
    try:
        for plan in plans:
            if plan["finished"]:
                arms.append({"arm": plan["arm"], "run_id": plan["run_id"], "status": "finished",
                             "skipped": True, "resumed": False})
                continue
            summary = train_flow(plan["overrides"], show_table=show_table)
            arms.append({"arm": plan["arm"], "run_id": plan["run_id"],
                         "status": summary["status"], "skipped": False,
                         "resumed": summary["resumed"]})
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    workdir = plans[0]["workdir"]
    report = study_report_task(workdir, study_id)
    return {"study_id": study_id, "workdir": str(workdir), "arms": arms, "report": report}
