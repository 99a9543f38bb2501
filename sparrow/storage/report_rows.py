"""Read-only loads of one run's report (`sparrow report`): its tables and token acceptance.

    ids = report_run_ids(workdir)
    tables = run_tables(workdir, run_id)           # run, step_metrics, bin_stats, events, ...
    steps = token_steps(workdir, run_id)
    totals, counts, tail = acceptance_of_step(workdir, run_id, step, bins=20, below=0.5,
                                              sample=5000, seed=0)

Everything goes through sparrow.storage.query, so a report reads while a run writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparrow.storage.query import query
from sparrow.storage.schema import renamed_row

# the bin_stats columns a report reads (a file from before schema version 5 gives None for
# the bounds, samples, counted and estimator)
BIN_REPORT_COLUMNS = (
    "step",
    "bin",
    "n",
    "mean",
    "p5",
    "pages_read",
    "schedule_name",
    "schedule_version",
    "p5_lo",
    "p5_hi",
    "samples",
    "counted",
    "estimator",
)
EVENT_COLUMNS = ("step", "bin", "kind", "p5", "target", "estimator")


def _rows(workdir, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    return query(workdir, sql, params).as_dicts()


def report_run_ids(workdir: str | Path) -> list[str]:
    """Every run id with a runs row, metrics or bin statistics, sorted."""
    sql = """SELECT run_id FROM (SELECT run_id FROM runs UNION SELECT run_id FROM step_metrics
             UNION SELECT run_id FROM bin_stats) ORDER BY run_id"""
    return [r["run_id"] for r in _rows(workdir, sql)]


def run_tables(workdir: str | Path, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """One run's rows: runs, step_metrics (by name, step), bin_stats (by step, bin),
    threshold_events, the schedules it stored or decoded with, stage times per stage."""
    return {
        "runs": _rows(workdir, "SELECT * FROM runs WHERE run_id = ?", [run_id]),
        "step_metrics": _rows(
            workdir,
            "SELECT step, name, value FROM step_metrics WHERE run_id = ? ORDER BY name, step",
            [run_id],
        ),
        "bin_stats": [
            _bin_row(r)
            for r in _rows(
                workdir, "SELECT * FROM bin_stats WHERE run_id = ? ORDER BY step, bin", [run_id]
            )
        ],
        "threshold_events": [
            {k: r.get(k) for k in EVENT_COLUMNS}
            for r in _rows(
                workdir,
                "SELECT * FROM threshold_events WHERE run_id = ? ORDER BY step, bin, kind",
                [run_id],
            )
        ],
        "sample_stats": sample_stats(workdir, run_id),
        "schedules": _rows(
            workdir,
            """
            SELECT name, version, step, reason, topk_pages, target, bin_tokens FROM schedules s
            WHERE run_id = ? OR EXISTS (SELECT 1 FROM bin_stats b WHERE b.run_id = ?
                  AND b.schedule_name = s.name AND b.schedule_version = s.version)
            ORDER BY coalesce(step, -1), version""",
            [run_id, run_id],
        ),
        "stages": _rows(
            workdir,
            """
            SELECT stage, count(*) AS steps, sum(duration_s) AS total_s, avg(duration_s) AS mean_s
            FROM stage_runs WHERE run_id = ? GROUP BY stage ORDER BY min(started_at), stage""",
            [run_id],
        ),
    }


def _bin_row(row: dict[str, Any]) -> dict[str, Any]:
    row = renamed_row("bin_stats", row)  # a file from before schema version 4
    return {k: row.get(k) for k in BIN_REPORT_COLUMNS}


def sample_stats(workdir: str | Path, run_id: str) -> list[dict[str, Any]]:
    """A run's per-trajectory rows by step, prompt, sample; none in a file from before schema
    version 5 that no writer has opened since (it has no sample_stats table)."""
    exists = _rows(
        workdir, "SELECT 1 AS one FROM duckdb_tables() WHERE table_name = 'sample_stats'"
    )
    if not exists:
        return []
    return _rows(
        workdir,
        "SELECT * FROM sample_stats WHERE run_id = ? ORDER BY step, prompt, sample",
        [run_id],
    )


def step_metric_rows(workdir: str | Path, run_id: str) -> list[dict[str, Any]]:
    """(step, name, value) rows of every metric of a run."""
    return _rows(workdir, "SELECT step, name, value FROM step_metrics WHERE run_id = ?", [run_id])


def token_steps(workdir: str | Path, run_id: str) -> list[int]:
    """The steps of a run with per-token rows (token_mismatch), ascending."""
    return [
        r["step"]
        for r in _rows(
            workdir,
            "SELECT DISTINCT step FROM token_mismatch WHERE run_id = ? ORDER BY step",
            [run_id],
        )
    ]


def acceptance_of_step(
    workdir: str | Path, run_id: str, step: int, *, bins: int, below: float, sample: int, seed: int
) -> tuple[dict[str, Any], dict[int, int], list[float]]:
    """One step's token acceptance: totals {n, mean, p5, tail_n} (tail_n: tokens below
    `below`), counts per histogram bin of [0, 1] in `bins` equal parts (1.0 in the last), and
    a repeatable reservoir sample of at most `sample` acceptances below `below`."""
    where = "FROM token_mismatch WHERE run_id = ? AND step = ?"
    params = [run_id, step]
    totals = _rows(
        workdir,
        f"""SELECT count(*) AS n, avg(acceptance) AS mean,
        quantile_cont(acceptance, 0.05) AS p5,
        count(*) FILTER (WHERE acceptance < {float(below)}) AS tail_n {where}""",
        params,
    )[0]
    counts = {
        row["b"]: row["n"]
        for row in _rows(
            workdir,
            f"""
        SELECT least(CAST(floor(acceptance * {int(bins)}) AS INTEGER), {int(bins) - 1}) AS b,
               count(*) AS n {where} GROUP BY b""",
            params,
        )
    }
    tail = [
        r["acceptance"]
        for r in _rows(
            workdir,
            f"""
        SELECT acceptance FROM (SELECT acceptance {where} AND acceptance < {float(below)})
        USING SAMPLE reservoir({int(sample)} ROWS) REPEATABLE ({int(seed)})""",
            params,
        )
    ]
    return totals, counts, tail
