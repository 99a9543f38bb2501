"""Rows of a run's life: `runs`, `stage_runs`, `step_metrics`.

    recorded = stage_record(store, run_id, step, "reward")      # None until the stage finished
    with store.connect() as conn:
        record_stage(conn, run_id, step, "reward", started, finished, duration_s, output_dir)
        replace_step_metrics(conn, run_id, step, {"reward/mean": 0.5})

Functions that take `conn` write inside the caller's transaction (`Store.connect()`), so a
stage's rows land together or not at all; functions that take `store` run their own. Every
writer deletes the rows of its key before inserting, so a stage re-run after a crash replaces
its rows instead of duplicating them. The listings for `sparrow runs` read through the
read-only query path (sparrow.storage.query).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sparrow.storage.query import QueryResult, query
from sparrow.storage.store import Store


@dataclass(frozen=True)
class StageRecord:
    """A finished stage as stage_runs holds it."""

    run_id: str
    step: int
    stage: str
    duration_s: float
    output_dir: str


# runs


def run_config_yaml(conn, run_id: str) -> str | None:
    """The resolved configuration a run was started with; None when there is no such run."""
    row = conn.execute("SELECT config_yaml FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return None if row is None else row[0]


def insert_run(conn, run_id: str, model_path: str, config_yaml: str, config_hash: str) -> None:
    conn.execute(
        "INSERT INTO runs (run_id, model_path, config_yaml, config_hash, status) "
        "VALUES (?, ?, ?, ?, 'running')",
        [run_id, model_path, config_yaml, config_hash],
    )


def set_run_status(conn, run_id: str, status: str, mlflow_run_id: str | None = None) -> None:
    """Set the status; the MLflow run id too when one is given (else it keeps the old one)."""
    conn.execute(
        "UPDATE runs SET status = ?, mlflow_run_id = coalesce(?, mlflow_run_id) WHERE run_id = ?",
        [status, mlflow_run_id, run_id],
    )


def run_status(conn, run_id: str) -> str | None:
    row = conn.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return None if row is None else row[0]


# stage_runs


def stage_record(store: Store, run_id: str, step: int, stage: str) -> StageRecord | None:
    with store.connect() as conn:
        row = conn.execute(
            "SELECT duration_s, output_dir FROM stage_runs WHERE run_id = ? AND step = ? AND stage = ?",
            [run_id, step, stage],
        ).fetchone()
    return None if row is None else StageRecord(run_id, step, stage, float(row[0]), row[1])


def stage_records(store: Store, run_id: str) -> list[StageRecord]:
    """Every finished stage of a run, in step order, then finish order."""
    with store.connect() as conn:
        rows = conn.execute(
            "SELECT step, stage, duration_s, output_dir FROM stage_runs WHERE run_id = ? "
            "ORDER BY step, finished_at",
            [run_id],
        ).fetchall()
    return [StageRecord(run_id, int(s), stage, float(d), out) for s, stage, d, out in rows]


def record_stage(
    conn,
    run_id: str,
    step: int,
    stage: str,
    started: datetime,
    finished: datetime,
    duration_s: float,
    output_dir: str,
) -> None:
    conn.execute(
        "DELETE FROM stage_runs WHERE run_id = ? AND step = ? AND stage = ?", [run_id, step, stage]
    )
    conn.execute(
        "INSERT INTO stage_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
        [run_id, step, stage, started, finished, duration_s, output_dir],
    )


def forget_stages(store: Store, run_id: str, step: int, stages) -> None:
    """Drop these stages' records at `step`, so a resumed flow runs them again."""
    with store.connect() as conn:
        for stage in stages:
            conn.execute(
                "DELETE FROM stage_runs WHERE run_id = ? AND step = ? AND stage = ?",
                [run_id, step, stage],
            )


def last_step_of_stage(conn, run_id: str, stage: str) -> int | None:
    """The highest step at which `stage` finished; None when it never did."""
    row = conn.execute(
        "SELECT max(step) FROM stage_runs WHERE run_id = ? AND stage = ?", [run_id, stage]
    ).fetchone()
    return None if row[0] is None else int(row[0])


# step_metrics


def replace_step_metrics(conn, run_id: str, step: int, metrics: Mapping[str, float]) -> None:
    """Write one step's metrics by name; a NaN or None is stored as NULL. Two statements
    for the whole step (a statement per metric cost about 1 ms each, 100 a step)."""
    names = list(metrics)
    values = [
        None if value is None or not math.isfinite(float(value)) else float(value)
        for value in metrics.values()
    ]
    conn.execute(
        "DELETE FROM step_metrics WHERE run_id = ? AND step = ? AND list_contains(?, name)",
        [run_id, step, names],
    )
    conn.execute(
        "INSERT INTO step_metrics SELECT ?, ?, unnest(?::VARCHAR[]), unnest(?::DOUBLE[])",
        [run_id, step, names, values],
    )


def step_metric(conn, run_id: str, step: int, name: str) -> float | None:
    """One metric of one step; None when it was never written (or is NULL)."""
    row = conn.execute(
        "SELECT value FROM step_metrics WHERE run_id = ? AND step = ? AND name = ?",
        [run_id, step, name],
    ).fetchone()
    return None if row is None else row[0]


def step_metrics(store: Store, run_id: str, step: int) -> dict[str, float | None]:
    with store.connect() as conn:
        rows = conn.execute(
            "SELECT name, value FROM step_metrics WHERE run_id = ? AND step = ? ORDER BY name",
            [run_id, step],
        ).fetchall()
    return {name: value for name, value in rows}


# read-only listings (sparrow runs), safe while a run writes

RUNS_LISTING_SQL = """
SELECT r.run_id, r.status, r.created_at, r.model_path, r.config_yaml, r.mlflow_run_id,
       (SELECT count(*) FROM stage_runs s WHERE s.run_id = r.run_id) AS stages,
       (SELECT count(*) FROM stage_runs s WHERE s.run_id = r.run_id
          AND s.stage = 'sync_weights') AS steps_done,
       (SELECT 'step-' || s.step || '/' || s.stage FROM stage_runs s WHERE s.run_id = r.run_id
          ORDER BY s.finished_at DESC LIMIT 1) AS last_stage
FROM runs r ORDER BY r.created_at, r.run_id"""

STAGES_LISTING_SQL = """
SELECT step, stage, started_at, finished_at, round(duration_s, 3) AS duration_s, output_dir
FROM stage_runs WHERE run_id = ? ORDER BY step, finished_at"""


def runs_listing(workdir: str | Path) -> QueryResult:
    """Every run with its stage counts and last stage (the result names damaged files too)."""
    return query(workdir, RUNS_LISTING_SQL)


def stages_listing(workdir: str | Path, run_id: str) -> QueryResult:
    return query(workdir, STAGES_LISTING_SQL, [run_id])


def recorded_run_ids(workdir: str | Path) -> list[str]:
    """The run ids of the `runs` table, sorted."""
    return [r[0] for r in query(workdir, "SELECT run_id FROM runs ORDER BY run_id").rows]
