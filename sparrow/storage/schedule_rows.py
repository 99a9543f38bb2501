"""Rows of the `schedules` and `calibration` tables.

    with store.connect() as conn:
        version = (newest_version(conn, "tiny-0.86") or 0) + 1
        insert_schedule(conn, row, version, run_id, step, reason, yaml_path)
        row, version = schedule_in_force(conn, name, run_id, start_version, step)

A schedule goes in and comes out as a plain dict of SCHEDULE_COLUMNS (name, page_size,
bin_tokens, topk_pages, reserved_bos, reserved_eos, skip_layers, target, selection,
dense_heads; the last two NULL in rows from before them): storage knows no
Schedule class; sparrow.sparse.io.schedule_from_dict turns a row back into one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparrow.storage.query import query
from sparrow.storage.schema import V5_COLUMNS

SCHEDULE_COLUMNS = (
    "name",
    "page_size",
    "bin_tokens",
    "topk_pages",
    "reserved_bos",
    "reserved_eos",
    "skip_layers",
    "target",
    "selection",
    "dense_heads",
)
# the columns a file from before them lacks (read-only readers take them as NULL)
LATER_SCHEDULE_COLUMNS = ("selection", "dense_heads")
# the calibration table's per (topk_pages, bin) columns, as AcceptanceTable.rows() gives them;
# those of schema version 5 (the floor, the estimator, the bounds) are NULL where a row lacks them
CALIBRATION_COLUMNS = (
    "topk_pages",
    "bin",
    "n",
    "p5",
    "mean",
    "p1",
    "p10",
    *(column for table, column, _ in V5_COLUMNS if table == "calibration"),
)


def newest_version(conn, name: str) -> int | None:
    row = conn.execute("SELECT max(version) FROM schedules WHERE name = ?", [name]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def insert_schedule(
    conn,
    schedule: Mapping[str, Any],
    version: int,
    run_id: str,
    step: int,
    reason: str,
    yaml_path: str | None = None,
) -> None:
    """Write (replace) one version of a schedule; `schedule` holds SCHEDULE_COLUMNS."""
    conn.execute(
        "DELETE FROM schedules WHERE name = ? AND version = ?", [schedule["name"], version]
    )
    conn.execute(
        f"INSERT INTO schedules (version, run_id, step, reason, yaml_path, "
        f"{', '.join(SCHEDULE_COLUMNS)}) VALUES ({', '.join('?' * (5 + len(SCHEDULE_COLUMNS)))})",
        [
            version,
            run_id,
            step,
            reason,
            yaml_path,
            # the later columns may be left out: NULL, the defaults
            *(
                _plain(schedule.get(c) if c in LATER_SCHEDULE_COLUMNS else schedule[c])
                for c in SCHEDULE_COLUMNS
            ),
        ],
    )


def schedule_row(values: Sequence[Any]) -> dict[str, Any]:
    """A schedule row from SCHEDULE_COLUMNS' values; a later column holding NULL is left out
    (a row from before it: the schedule's default)."""
    return {
        c: v
        for c, v in zip(SCHEDULE_COLUMNS, values)
        if v is not None or c not in LATER_SCHEDULE_COLUMNS
    }


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def schedule_in_force(
    conn, name: str, run_id: str, start_version: int, step: int
) -> tuple[dict[str, Any], int] | None:
    """(row, version): the newest version `run_id` stored before `step` above the one it
    started with, else the one it started with; None when even that one is missing."""
    row = conn.execute(
        f"SELECT version, {', '.join(SCHEDULE_COLUMNS)} FROM schedules WHERE name = ? AND "
        "((run_id = ? AND step < ? AND version > ?) OR version = ?) "
        "ORDER BY version DESC LIMIT 1",
        [name, run_id, step, start_version, start_version],
    ).fetchone()
    return None if row is None else (schedule_row(row[1:]), int(row[0]))


def newest_schedule(conn, name: str) -> tuple[dict[str, Any], int] | None:
    """(row, version) of the newest stored version of `name`; None when it has none."""
    row = conn.execute(
        f"SELECT version, {', '.join(SCHEDULE_COLUMNS)} FROM schedules "
        "WHERE name = ? ORDER BY version DESC LIMIT 1",
        [name],
    ).fetchone()
    return None if row is None else (schedule_row(row[1:]), int(row[0]))


def stored_schedule(
    workdir: str | Path, name: str, version: int | None = None
) -> tuple[dict[str, Any], int, str] | None:
    """(row, version, reason) of `name` at `version` (default: the newest), read-only; None
    when there is no such row."""
    where, params = "name = ?", [name]
    if version is not None:
        where, params = where + " AND version = ?", params + [int(version)]
    # select *: a file no writer has opened since a column was added lacks it (NULL here)
    result = query(
        workdir,
        f"SELECT * FROM schedules WHERE {where} ORDER BY version DESC LIMIT 1",
        params,
    )
    if not result.rows:
        return None
    row = result.as_dicts()[0]
    return schedule_row([row.get(c) for c in SCHEDULE_COLUMNS]), int(row["version"]), row["reason"]


def replace_calibration(
    conn, calibration_id: str, model_path: str, rows: Sequence[Mapping[str, Any]]
) -> None:
    """A calibration's table: one row per (topk_pages, bin) holding CALIBRATION_COLUMNS."""
    conn.execute("DELETE FROM calibration WHERE calibration_id = ?", [calibration_id])
    if rows:
        conn.executemany(
            f"INSERT INTO calibration (calibration_id, model_path, {', '.join(CALIBRATION_COLUMNS)}) "
            f"VALUES ({', '.join('?' * (2 + len(CALIBRATION_COLUMNS)))})",
            [[calibration_id, model_path, *(r.get(c) for c in CALIBRATION_COLUMNS)] for r in rows],
        )
