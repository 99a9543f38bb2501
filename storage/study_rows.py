"""Rows of the `study_arms` table and the read-only loads of a study's report.

    with store.connect() as conn:
        replace_study_arms(conn, "s1", [{"arm": "fixed", "index": 0, "run_id": "s1-fixed",
                                         "overrides": [...]}], study_yaml)
    ids = study_ids(workdir)
    rows = study_tables(workdir, "s1")      # arms, runs, step_metrics, bin_stats, schedules
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from storage.errors import StorageError
from storage.query import query
from storage.schedule_rows import SCHEDULE_COLUMNS
from storage.schema import renamed_row

# the runs of one study's arms (one parameter: the study id)
_MINE = "run_id IN (SELECT run_id FROM study_arms WHERE study_id = ?)"


def replace_study_arms(conn, study_id: str, plans: Sequence[Mapping[str, Any]],
                       definition: str) -> None:
    """The study's rows, replaced by the arms as planned now (arm, index, run_id, overrides)."""
    conn.execute("DELETE FROM study_arms WHERE study_id = ?", [study_id])
    for plan in plans:
        conn.execute("INSERT INTO study_arms (study_id, arm, arm_index, run_id, overrides, "
                     "study_yaml) VALUES (?, ?, ?, ?, ?, ?)",
                     [study_id, plan["arm"], plan["index"], plan["run_id"], plan["overrides"],
                      definition])


def _rows(workdir, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    return query(workdir, sql, params).as_dicts()


def study_ids(workdir: str | Path) -> list[str]:
    try:
        rows = _rows(workdir, "SELECT DISTINCT study_id FROM study_arms ORDER BY study_id")
    except StorageError:  # a workdir no study has written to (or from before the table)
        return []
    return [r["study_id"] for r in rows]


def study_tables(workdir: str | Path, study_id: str) -> dict[str, list[dict[str, Any]]]:
    """A study's rows, read-only: arms (in arm order), runs, step_metrics, bin_stats (by
    step and bin) and the schedules its arms' bin_stats name."""
    return {
        "arms": _rows(workdir, "SELECT arm, run_id, overrides, study_yaml FROM study_arms "
                               "WHERE study_id = ? ORDER BY arm_index", [study_id]),
        "runs": _rows(workdir, f"SELECT * FROM runs WHERE {_MINE}", [study_id]),
        "step_metrics": _rows(workdir, f"SELECT run_id, step, name, value FROM step_metrics "
                                       f"WHERE {_MINE}", [study_id]),
        # a file from before schema version 4 gives its rows under the new column names
        "bin_stats": [renamed_row("bin_stats", r) for r in _rows(
            workdir, f"SELECT * FROM bin_stats WHERE {_MINE} ORDER BY step, bin", [study_id])],
        "schedules": _rows(workdir, f"""
            SELECT version, {', '.join(SCHEDULE_COLUMNS)} FROM schedules s WHERE EXISTS (
                SELECT 1 FROM bin_stats b WHERE b.{_MINE} AND b.schedule_name = s.name
                AND b.schedule_version = s.version)""", [study_id]),
    }
