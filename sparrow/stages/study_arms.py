"""The study's arms made concrete: each arm's train overrides, its pinned schedule, whether it
is finished, and the study_arms rows that let the report find them later.

    plans = plan_study_task(study_id, "default", study_overrides=[], overrides=["pipeline.steps=2"])
    plans[0]["run_id"], plans[0]["overrides"], plans[0]["finished"]

An arm's overrides are, in order: the study's `common`, the command line's, the arm's own, then
`schedule.name=<pinned file>` and `pipeline.run_id=<study_id>-<arm>`. Every arm's config is
checked before anything runs, and must keep the model, seeds and workdir of the study's
common config (a study compares arms from the same start).

Schedules in one workdir are versioned by name, and a run starts from the newest version of
its schedule, which another arm's controller may have just made. So each arm decodes with a
copy of its schedule as it stood when the study first planned the arm (for a `fixed_budget` arm:
flat, `fixed_topk_pages` in every bin), renamed `<study_id>-<arm>` and written to
`<workdir>/studies/<study_id>/schedules/<arm>.yaml`; a rerun reuses that file, so a resumed
arm keeps its configuration. An arm is finished when its run is marked finished and has
recorded sync_weights for every step up to pipeline.steps.

With `own_workdirs: true` each arm's run writes `<workdir>/studies/<study_id>/arms/<arm>/`
(the last override of its list, `pipeline.workdir=...`), so arms can run at once in separate
processes; the study's workdir keeps the study_arms rows and the pinned schedules, and the
report reads each arm's rows from its own DuckDB file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.config import ConfigError, SparrowConfig, load_config
from sparrow.config.study import (
    StudyArm,
    StudyConfig,
    arm_workdir,
    check_study_id,
    load_study,
    study_yaml,
)
from sparrow.sparse import Schedule, resolve_schedule, save_schedule_yaml
from sparrow.sparse.io import schedule_from_dict
from sparrow.storage import Store
from sparrow.storage.run_rows import last_step_of_stage, run_status
from sparrow.storage.schedule_rows import newest_schedule
from sparrow.storage.study_rows import replace_study_arms, run_finished_through

# what every arm of a study shares (checked on the resolved configs)
SHARED_KEYS = (
    "model.path",
    "pipeline.workdir",
    "pipeline.seed",
    "rollout.seed",
    "data.train",
    "ray.address",
)
# how long planning waits for the study's workdir while another arm's process plans
PLAN_WAIT_S = 120.0


def study_dir(workdir: str | Path, study_id: str) -> Path:
    return Path(workdir) / "studies" / study_id


def own_workdir(workdir: str | Path, study_id: str, arm: str) -> Path:
    """Where an arm of a study with own_workdirs writes its run."""
    return study_dir(workdir, study_id) / "arms" / arm


def _value(cfg: SparrowConfig, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _stored_schedule(conn, name: str) -> tuple[Schedule, int] | None:
    stored = newest_schedule(conn, name)
    if stored is None:
        return None
    data, version = stored
    return schedule_from_dict(data, source=f"schedules row ({name}, v{version})"), version


def pin_schedule(
    conn, study: StudyConfig, study_id: str, arm: StudyArm, cfg: SparrowConfig
) -> Path:
    """The arm's schedule file (written on the arm's first planning, reused after)."""
    path = study_dir(cfg.pipeline.workdir, study_id) / "schedules" / f"{arm.name}.yaml"
    if path.is_file():
        return path
    stored = _stored_schedule(conn, cfg.schedule.name)
    base, source = (
        (stored[0], f"{stored[0].name} v{stored[1]}")
        if stored
        else (resolve_schedule(cfg.schedule.name), cfg.schedule.name)
    )
    topk_pages = base.topk_pages
    if arm.fixed_budget:
        topk_pages = (study.fixed_topk_pages,) * base.num_bins
        source += f", flat at {study.fixed_topk_pages} pages"
    pinned = dataclasses.replace(
        base.configured(cfg.schedule),
        name=f"{study_id}-{arm.name}",
        topk_pages=topk_pages,
        target=cfg.schedule.target,
        description=f"study {study_id}, arm {arm.name}: {source}",
    )
    return save_schedule_yaml(pinned, path)


def arm_finished(conn, run_id: str, steps: int) -> bool:
    last = last_step_of_stage(conn, run_id, "sync_weights")
    return run_status(conn, run_id) == "finished" and (last or 0) >= steps


def arm_config(
    study: StudyConfig, arm: StudyArm, overrides: list[str], base: SparrowConfig
) -> tuple[list[str], SparrowConfig]:
    arm_overrides = [*study.common, *overrides, *arm.overrides]
    cfg = load_config(arm_overrides)
    if cfg.pipeline.run_id:
        raise ConfigError(
            f"arm {arm.name!r}: pipeline.run_id is set by the study "
            f"(<study_id>-<arm>); leave it out"
        )
    for key in SHARED_KEYS:
        if _value(cfg, key) != _value(base, key):
            raise ConfigError(
                f"arm {arm.name!r} changes {key} ({_value(base, key)!r} -> "
                f"{_value(cfg, key)!r}); a study's arms share model, data, seeds "
                f"and workdir: set it in `common` or on the command line"
            )
    return arm_overrides, cfg


def plan_study(
    study_id: str, study_spec: str, study_overrides: list[str], overrides: list[str]
) -> list[dict]:
    """One plan per arm: {arm, index, run_id, overrides, finished, workdir, arm_workdir,
    ray_address}."""
    check_study_id(study_id)
    study = load_study(study_spec, study_overrides)
    base = load_config([*study.common, *overrides])
    configs = [arm_config(study, arm, overrides, base) for arm in study.arms]
    store = Store.open_writer(base.pipeline.workdir, wait_s=PLAN_WAIT_S)
    try:
        with store.connect() as conn:
            plans = []
            for index, (arm, (arm_overrides, cfg)) in enumerate(zip(study.arms, configs)):
                run_id = f"{study_id}-{arm.name}"
                schedule = pin_schedule(conn, study, study_id, arm, cfg)
                full = [*arm_overrides, f"schedule.name={schedule}", f"pipeline.run_id={run_id}"]
                if study.own_workdirs:
                    own = own_workdir(base.pipeline.workdir, study_id, arm.name)
                    full.append(f"pipeline.workdir={own}")
                    finished = run_finished_through(own, run_id, cfg.pipeline.steps)
                else:
                    finished = arm_finished(conn, run_id, cfg.pipeline.steps)
                plans.append(
                    {
                        "arm": arm.name,
                        "index": index,
                        "run_id": run_id,
                        "overrides": full,
                        "workdir": base.pipeline.workdir,
                        "arm_workdir": str(arm_workdir(full, base.pipeline.workdir)),
                        "ray_address": base.ray.address,
                        "finished": finished,
                    }
                )
            record_arms(conn, study_id, plans, study_yaml(study))
    finally:
        store.close()
    return plans


def record_arms(conn, study_id: str, plans: list[dict], definition: str) -> None:
    """The study's study_arms rows, replaced by the arms as planned now."""
    replace_study_arms(conn, study_id, plans, definition)


@task(name="plan_study", cache_policy=NONE)
def plan_study_task(
    study_id: str, study_spec: str, study_overrides: list[str], overrides: list[str]
) -> list[dict]:
    return plan_study(study_id, study_spec, list(study_overrides), list(overrides))
