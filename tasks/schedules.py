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

from sparrow_core.sparse import Schedule, resolve_schedule
from sparrow_core.sparse.io import schedule_from_dict
from storage import Store
from tasks.records import replace_step_metrics

START_METRIC = "schedule/version"
_COLUMNS = ("name", "page_size", "bin_tokens", "topk_pages", "reserved_bos", "reserved_eos",
            "skip_layers", "target")


def start_schedule(store: Store, run_id: str, spec: str) -> tuple[str, int]:
    """(name, version) the run starts with; chosen once per run, read back on resume."""
    with store.connect() as conn:
        name = spec if _newest(conn, spec) is not None else resolve_schedule(spec).name
        started = conn.execute(
            "SELECT value FROM step_metrics WHERE run_id = ? AND step = 0 AND name = ?",
            [run_id, START_METRIC]).fetchone()
        if started is not None:
            return name, int(started[0])
        version = _newest(conn, name)
        if version is None:
            version = 1
            insert_schedule(conn, resolve_schedule(spec), version, run_id, 0, "initial")
        replace_step_metrics(conn, run_id, 0, {START_METRIC: float(version)})
    return name, version


def schedule_in_force(store: Store, run_id: str, name: str, start_version: int,
                      step: int) -> tuple[Schedule, int]:
    with store.connect() as conn:
        row = conn.execute(
            f"SELECT version, {', '.join(_COLUMNS)} FROM schedules WHERE name = ? AND "
            "((run_id = ? AND step < ? AND version > ?) OR version = ?) "
            "ORDER BY version DESC LIMIT 1",
            [name, run_id, step, start_version, start_version]).fetchone()
    if row is None:
        raise LookupError(f"schedule {name!r} version {start_version} is not in the schedules table")
    data = dict(zip(_COLUMNS, row[1:]))
    return schedule_from_dict(data, source=f"schedules row ({name}, v{row[0]})"), int(row[0])


def insert_schedule(conn, schedule: Schedule, version: int, run_id: str, step: int,
                    reason: str, yaml_path: str | None = None) -> None:
    conn.execute("DELETE FROM schedules WHERE name = ? AND version = ?", [schedule.name, version])
    conn.execute(
        "INSERT INTO schedules (name, version, run_id, step, reason, page_size, bin_tokens, "
        "topk_pages, reserved_bos, reserved_eos, skip_layers, target, yaml_path) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [schedule.name, version, run_id, step, reason, schedule.page_size, schedule.bin_tokens,
         list(schedule.topk_pages), schedule.reserved_bos, schedule.reserved_eos,
         list(schedule.skip_layers), schedule.target, yaml_path])


def _newest(conn, name: str) -> int | None:
    row = conn.execute("SELECT max(version) FROM schedules WHERE name = ?", [name]).fetchone()
    return None if row is None or row[0] is None else int(row[0])
