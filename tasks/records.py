"""DuckDB rows the train flow writes: stage_runs, step_metrics, and the per-run lookups.

    recorded = stage_record(store, run_id, step, "reward")      # None until the stage finished
    with store.connect() as conn:
        record_stage(conn, run_id, step, "reward", started, finished, duration_s, output_dir)
        replace_step_metrics(conn, run_id, step, {"reward/mean": 0.5})

Every writer deletes the rows of its key before inserting, inside the caller's transaction,
so a stage that is re-run after a crash replaces its rows instead of duplicating them. Only
tasks/ and pipelines/ use this module (storage holds the schema, sparrow_core knows no DuckDB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping

from storage import Store


@dataclass(frozen=True)
class StageRecord:
    """A finished stage as stage_runs holds it."""

    run_id: str
    step: int
    stage: str
    duration_s: float
    output_dir: str


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


def record_stage(conn, run_id: str, step: int, stage: str, started: datetime,
                 finished: datetime, duration_s: float, output_dir: str) -> None:
    conn.execute("DELETE FROM stage_runs WHERE run_id = ? AND step = ? AND stage = ?",
                 [run_id, step, stage])
    conn.execute("INSERT INTO stage_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                 [run_id, step, stage, started, finished, duration_s, output_dir])


def forget_stages(store: Store, run_id: str, step: int, stages) -> None:
    """Drop these stages' records at `step`, so a resumed flow runs them again."""
    with store.connect() as conn:
        for stage in stages:
            conn.execute("DELETE FROM stage_runs WHERE run_id = ? AND step = ? AND stage = ?",
                         [run_id, step, stage])


def replace_step_metrics(conn, run_id: str, step: int, metrics: Mapping[str, float]) -> None:
    """Write one step's metrics by name; a NaN or None is stored as NULL."""
    for name, value in metrics.items():
        conn.execute("DELETE FROM step_metrics WHERE run_id = ? AND step = ? AND name = ?",
                     [run_id, step, name])
        number = None if value is None or not math.isfinite(float(value)) else float(value)
        conn.execute("INSERT INTO step_metrics VALUES (?, ?, ?, ?)", [run_id, step, name, number])


def step_metrics(store: Store, run_id: str, step: int) -> dict[str, float | None]:
    with store.connect() as conn:
        rows = conn.execute(
            "SELECT name, value FROM step_metrics WHERE run_id = ? AND step = ? ORDER BY name",
            [run_id, step],
        ).fetchall()
    return {name: value for name, value in rows}
