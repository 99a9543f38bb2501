"""Versioned schedules in DuckDB: the schedule a run starts with and the one in force at a step.

    name, version = start_schedule(store, run_id, "tiny-0.86")   # at run start (idempotent)
    schedule, version = schedule_in_force(store, run_id, name, step=3)

At run start the newest stored version of the configured schedule is taken; when the name has
no row yet, the preset or file it names is stored as version 1. The version a run started
with is kept as its step-0 metric `schedule/version`, so a resumed run starts from the same
one. At step n the schedule in force is the newest version this run stored before step n
(reoptimize_schedule will add them), else the one it started with: a resumed step decodes
with exactly the schedule its first attempt would have used.
"""

from __future__ import annotations

from sparrow.sparse import Schedule, resolve_schedule
from sparrow.sparse.io import schedule_from_dict
from sparrow.storage import Store, schedule_rows
from sparrow.storage.run_rows import replace_step_metrics, step_metric

START_METRIC = "schedule/version"


def start_schedule(store: Store, run_id: str, spec: str, settings=None) -> tuple[str, int]:
    """(name, version) the run starts with; chosen once per run, read back on resume.
    settings: the run's `schedule` config group, whose selection, dense_heads and page_size
    the run decodes with (Schedule.configured); a newest version that differs in them is
    followed by a new version that has them."""
    with store.connect() as conn:
        newest = schedule_rows.newest_version
        name = spec if newest(conn, spec) is not None else resolve_schedule(spec).name
        started = step_metric(conn, run_id, 0, START_METRIC)
        if started is not None:
            return name, int(started)
        version = newest(conn, name)
        if version is None:
            version = 1
            base = resolve_schedule(spec)
            schedule = base if settings is None else base.configured(settings)
            insert_schedule(conn, schedule, version, run_id, 0, "initial")
        elif settings is not None:
            found = schedule_rows.newest_schedule(conn, name)
            stored = schedule_from_dict(found[0], source=f"schedules row ({name}, v{version})")
            schedule = stored.configured(settings)
            if schedule != stored:
                version += 1
                reason = f"configured: selection {schedule.selection}, page {schedule.page_size}"
                insert_schedule(conn, schedule, version, run_id, 0, reason)
        replace_step_metrics(conn, run_id, 0, {START_METRIC: float(version)})
    return name, version


def schedule_in_force(
    store: Store, run_id: str, name: str, start_version: int, step: int
) -> tuple[Schedule, int]:
    with store.connect() as conn:
        found = schedule_rows.schedule_in_force(conn, name, run_id, start_version, step)
    if found is None:
        raise LookupError(
            f"schedule {name!r} version {start_version} is not in the schedules table"
        )
    data, version = found
    return schedule_from_dict(data, source=f"schedules row ({name}, v{version})"), version


def insert_schedule(
    conn,
    schedule: Schedule,
    version: int,
    run_id: str,
    step: int,
    reason: str,
    yaml_path: str | None = None,
) -> None:
    """Store one version of `schedule` inside the caller's transaction."""
    row = {c: getattr(schedule, c) for c in schedule_rows.SCHEDULE_COLUMNS}
    schedule_rows.insert_schedule(conn, row, version, run_id, step, reason, yaml_path)
