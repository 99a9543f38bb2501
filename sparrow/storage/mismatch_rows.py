"""Rows of the mismatch history: `bin_stats`, `threshold_events` and `sample_stats`.

    with store.connect() as conn:
        replace_bin_stats(conn, run_id, step, rows)          # rows: dicts of BIN_COLUMNS
        before = below_target_bins(conn, run_id, step - 1)
        replace_threshold_events(conn, run_id, step, [(bin, "below_target", p5, target)],
                                 estimator="top20_lower_bound")
        replace_sample_stats(conn, run_id, step, rows)       # rows: dicts of SAMPLE_COLUMNS
    history = statistic_history(conn, run_id, "p5", up_to_step=7)   # counted bins only

Each writer replaces one step's rows, so an aggregate_mismatch stage re-run after a crash
leaves exactly one copy of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparrow.storage.schema import V5_COLUMNS, V6_COLUMNS

# bin_stats columns after (run_id, step), as a step's rows give them
BIN_COLUMNS = (
    "bin",
    "n",
    "mean",
    "p1",
    "p5",
    "p10",
    "p50",
    "beta_a",
    "beta_b",
    "beta_var",
    "ks",
    "pages_read",
    "schedule_name",
    "schedule_version",
    "min",
    "share_below_half",
    *(column for table, column, _ in V5_COLUMNS if table == "bin_stats"),
)
# sample_stats columns after (run_id, step): one row per trajectory
SAMPLE_COLUMNS = (
    "prompt",
    "sample",
    "tokens",
    "mismatch_sum",
    "lookup_tokens",
    "lookup_mismatch_sum",
    "min_acceptance",
    "log_weight",
    "estimator",
    *(column for table, column, _ in V6_COLUMNS if table == "sample_stats"),
)
# statistics a caller may ask the history of (a column name is put into SQL: never user text)
STATISTIC_COLUMNS = ("mean", "p1", "p5", "p10", "p50", "min", "share_below_half")


def replace_bin_stats(conn, run_id: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    conn.execute("DELETE FROM bin_stats WHERE run_id = ? AND step = ?", [run_id, step])
    for row in rows:
        conn.execute(
            f"INSERT INTO bin_stats (run_id, step, {', '.join(BIN_COLUMNS)}) VALUES "
            f"({', '.join('?' * (2 + len(BIN_COLUMNS)))})",
            [run_id, step, *(row.get(c) for c in BIN_COLUMNS)],
        )


def replace_sample_stats(conn, run_id: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """One step's per-trajectory rows (SAMPLE_COLUMNS; lookup_* None while roles are unknown),
    in one INSERT of a list per column (a statement per row cost about 1 ms each)."""
    conn.execute("DELETE FROM sample_stats WHERE run_id = ? AND step = ?", [run_id, step])
    if not rows:
        return
    # the insert casts each list to its column's type (a list of None included)
    lists = ", ".join("unnest(?)" for _ in SAMPLE_COLUMNS)
    conn.execute(
        f"INSERT INTO sample_stats (run_id, step, {', '.join(SAMPLE_COLUMNS)}) "
        f"SELECT ?, ?, {lists}",
        [run_id, step, *([_plain(row.get(c)) for row in rows] for c in SAMPLE_COLUMNS)],
    )


def _plain(value: Any) -> Any:
    """A numpy (or torch) scalar as the Python value DuckDB takes in a list parameter."""
    return value.item() if hasattr(value, "item") else value


def below_target_bins(conn, run_id: str, step: int) -> set[int]:
    """The bins that recorded a below_target event at `step`."""
    return {
        int(b)
        for (b,) in conn.execute(
            "SELECT bin FROM threshold_events WHERE run_id = ? AND step = ? AND kind = "
            "'below_target'",
            [run_id, step],
        ).fetchall()
    }


def event_bins(conn, run_id: str, kind: str, before_step: int) -> set[int]:
    """The bins that recorded an event of `kind` at a step before `before_step`."""
    return {
        int(b)
        for (b,) in conn.execute(
            "SELECT DISTINCT bin FROM threshold_events WHERE run_id = ? AND kind = ? AND step < ?",
            [run_id, kind, before_step],
        ).fetchall()
    }


def replace_threshold_events(
    conn,
    run_id: str,
    step: int,
    events: Sequence[tuple[int, str, float, float]],
    estimator: str | None = None,
) -> None:
    """One step's events, each (bin, kind, p5, target); kind is below_target or recovered;
    estimator: the acceptance estimator the value came from. Only those two kinds are
    replaced: reoptimize_schedule records distill_switch events."""
    conn.execute(
        "DELETE FROM threshold_events WHERE run_id = ? AND step = ? AND kind IN "
        "('below_target', 'recovered')",
        [run_id, step],
    )
    for b, kind, p5, target in events:
        conn.execute(
            "INSERT INTO threshold_events (run_id, step, bin, kind, p5, target, estimator) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [run_id, step, b, kind, p5, target, estimator],
        )


def statistic_history(
    conn, run_id: str, column: str, up_to_step: int
) -> list[tuple[int, int, float]]:
    """(step, bin, value) of one bin_stats statistic up to a step, NULLs and bins below the
    floor (counted false) left out; rows from before the floor existed (NULL) count."""
    if column not in STATISTIC_COLUMNS:
        raise ValueError(f"not a bin_stats statistic: {column!r}; one of {STATISTIC_COLUMNS}")
    rows = conn.execute(
        f"SELECT step, bin, {column} FROM bin_stats WHERE run_id = ? AND "
        f"step <= ? AND {column} IS NOT NULL AND counted IS NOT FALSE",
        [run_id, up_to_step],
    ).fetchall()
    return [(int(s), int(b), float(v)) for s, b, v in rows]


def add_threshold_events(
    conn, run_id: str, step: int, events: Sequence[tuple[int, str, float | None, float]]
) -> None:
    """Events (bin, kind, p5, target) added beside the step's others (distill_switch)."""
    for b, kind, p5, target in events:
        conn.execute(
            "INSERT INTO threshold_events (run_id, step, bin, kind, p5, target) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [run_id, step, b, kind, p5, target],
        )
