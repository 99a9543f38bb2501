"""Rows of the evaluate stage: `eval_results`, one per (step, data_source, k).

    with store.connect() as conn:                 # the transaction that records the stage
        replace_eval_results(conn, run_id, step, rows)    # rows: dicts of EVAL_COLUMNS
    eval_results(store, run_id)                   # [{"step": 2, "data_source": "...", ...}]

A re-run of a step's evaluation replaces that step's rows (delete-then-insert by key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparrow.storage.store import Store

# eval_results columns after (run_id, step)
EVAL_COLUMNS = ("data_source", "k", "pass_at_k", "accuracy", "prompts", "samples_per_prompt")


def replace_eval_results(conn, run_id: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    conn.execute("DELETE FROM eval_results WHERE run_id = ? AND step = ?", [run_id, step])
    if rows:
        conn.executemany(
            f"INSERT INTO eval_results (run_id, step, {', '.join(EVAL_COLUMNS)}) VALUES "
            f"({', '.join('?' * (2 + len(EVAL_COLUMNS)))})",
            [[run_id, step, *(row[c] for c in EVAL_COLUMNS)] for row in rows],
        )


def eval_results(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's evaluation rows, by step, data_source and k."""
    with store.connect() as conn:
        cursor = conn.execute(
            f"SELECT step, {', '.join(EVAL_COLUMNS)} FROM eval_results WHERE run_id = ? "
            "ORDER BY step, data_source, k",
            [run_id],
        )
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
