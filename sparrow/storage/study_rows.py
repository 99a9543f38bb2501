"""Rows of the `study_arms` table and the read-only loads of a study's report.

    with store.connect() as conn:
        replace_study_arms(conn, "s1", [{"arm": "fixed", "index": 0, "run_id": "s1-fixed",
                                         "overrides": [...]}], study_yaml)
    ids = study_ids(workdir)
    rows = study_tables(workdir, "s1")      # arms, runs, step_metrics, bin_stats, schedules
    arms = study_arm_rows(workdir, "s1")    # the arms alone
    rows = run_tables(arm_workdir, ["s1-dense"])   # an arm that wrote its own workdir

A study whose arms write their own workdirs (study.own_workdirs) keeps its study_arms rows in
the study's workdir and each arm's runs, metrics and bin_stats in the arm's; the report reads
the arms' rows with study_arm_rows and each workdir's with run_tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparrow.storage.errors import StorageError
from sparrow.storage.layout import db_path
from sparrow.storage.query import query
from sparrow.storage.schedule_rows import LATER_SCHEDULE_COLUMNS, SCHEDULE_COLUMNS
from sparrow.storage.schema import renamed_row

# the schedule columns every file holds (a report reads files no writer has opened since)
_SCHEDULE_COLUMNS = tuple(c for c in SCHEDULE_COLUMNS if c not in LATER_SCHEDULE_COLUMNS)


def replace_study_arms(
    conn, study_id: str, plans: Sequence[Mapping[str, Any]], definition: str
) -> None:
    """The study's rows, replaced by the arms as planned now (arm, index, run_id, overrides)."""
    conn.execute("DELETE FROM study_arms WHERE study_id = ?", [study_id])
    for plan in plans:
        conn.execute(
            "INSERT INTO study_arms (study_id, arm, arm_index, run_id, overrides, "
            "study_yaml) VALUES (?, ?, ?, ?, ?, ?)",
            [study_id, plan["arm"], plan["index"], plan["run_id"], plan["overrides"], definition],
        )


def _rows(workdir, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    return query(workdir, sql, params).as_dicts()


def study_ids(workdir: str | Path) -> list[str]:
    try:
        rows = _rows(workdir, "SELECT DISTINCT study_id FROM study_arms ORDER BY study_id")
    except StorageError:  # a workdir no study has written to (or from before the table)
        return []
    return [r["study_id"] for r in rows]


def study_arm_rows(workdir: str | Path, study_id: str) -> list[dict[str, Any]]:
    """The study's arms in arm order: arm, run_id, overrides, study_yaml."""
    return _rows(
        workdir,
        "SELECT arm, run_id, overrides, study_yaml FROM study_arms "
        "WHERE study_id = ? ORDER BY arm_index",
        [study_id],
    )


def run_tables(workdir: str | Path, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows of these runs, read-only: runs, step_metrics, bin_stats (by step and bin) and the
    schedules their bin_stats name. A workdir with no DuckDB file yet gives empty lists."""
    tables: dict[str, list[dict[str, Any]]] = {
        "runs": [],
        "step_metrics": [],
        "bin_stats": [],
        "schedules": [],
    }
    if not run_ids or not db_path(workdir).is_file():
        return tables
    mine = f"run_id IN ({', '.join('?' for _ in run_ids)})"
    ids = list(run_ids)
    tables["runs"] = _rows(workdir, f"SELECT * FROM runs WHERE {mine}", ids)
    tables["step_metrics"] = _rows(
        workdir, f"SELECT run_id, step, name, value FROM step_metrics WHERE {mine}", ids
    )
    # a file from before schema version 4 gives its rows under the new column names
    tables["bin_stats"] = [
        renamed_row("bin_stats", r)
        for r in _rows(workdir, f"SELECT * FROM bin_stats WHERE {mine} ORDER BY step, bin", ids)
    ]
    tables["schedules"] = _rows(
        workdir,
        f"""
        SELECT version, {", ".join(_SCHEDULE_COLUMNS)} FROM schedules s WHERE EXISTS (
            SELECT 1 FROM bin_stats b WHERE b.{mine} AND b.schedule_name = s.name
            AND b.schedule_version = s.version)""",
        ids,
    )
    return tables


def study_tables(workdir: str | Path, study_id: str) -> dict[str, list[dict[str, Any]]]:
    """A study's rows from one workdir, read-only: arms (in arm order) and its runs' tables
    (run_tables)."""
    arms = study_arm_rows(workdir, study_id)
    return {"arms": arms, **run_tables(workdir, [a["run_id"] for a in arms])}


def run_finished_through(workdir: str | Path, run_id: str, steps: int) -> bool:
    """True when the run is marked finished and recorded sync_weights for every step up to
    `steps`; read-only, False for a workdir without a DuckDB file."""
    if not db_path(workdir).is_file():
        return False
    rows = _rows(
        workdir,
        "SELECT (SELECT status FROM runs WHERE run_id = ?) AS status, "
        "(SELECT max(step) FROM stage_runs WHERE run_id = ? "
        "AND stage = 'sync_weights') AS last",
        [run_id, run_id],
    )
    return bool(rows) and rows[0]["status"] == "finished" and (rows[0]["last"] or 0) >= steps
