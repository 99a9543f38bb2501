"""Schema version 4 renames calibration.budget_pages to topk_pages and bin_stats.budget_pages
to pages_read (docs/glossary.md). A file made with the version 3 schema stays readable before
any writer opens it, and the next writer renames the columns in place, rows kept; the per-token
Parquet files written before the rename read under the new name."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.storage import Store, query
from sparrow.storage.report_rows import run_tables
from sparrow.storage.schedule_rows import replace_calibration
from sparrow.storage.schema import SCHEMA_VERSION, TABLES
from sparrow.storage.study_rows import study_tables

# the two tables as schema version 3 created them
V3_TABLES = {
    "bin_stats": TABLES["bin_stats"].replace("pages_read INTEGER", "budget_pages INTEGER"),
    "calibration": TABLES["calibration"].replace("topk_pages", "budget_pages"),
}


@pytest.fixture
def v3_file(tmp_path):
    """A workdir whose DuckDB file has the version 3 tables, with rows."""
    conn = duckdb.connect(str(tmp_path / "sparrow.duckdb"))
    for name in (
        "meta",
        "runs",
        "stage_runs",
        "schedules",
        "threshold_events",
        "step_metrics",
        "study_arms",
    ):
        conn.execute(TABLES[name])
    for ddl in V3_TABLES.values():
        assert "budget_pages" in ddl
        conn.execute(ddl)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    conn.execute(
        "INSERT INTO bin_stats (run_id, step, bin, n, mean, p5, budget_pages, "
        "schedule_name, schedule_version) VALUES ('r', 1, 0, 10, 0.9, 0.8, 7, 's', 1)"
    )
    conn.execute(
        "INSERT INTO calibration (calibration_id, model_path, budget_pages, bin, n, p5, "
        "mean) VALUES ('c', 'm', 4, 0, 10, 0.85, 0.95)"
    )
    conn.execute(
        "INSERT INTO study_arms (study_id, arm, arm_index, run_id) VALUES ('s1', 'dense', 0, 'r')"
    )
    conn.close()
    return tmp_path


def _columns(workdir, table: str) -> list[str]:
    return [r[0] for r in query(workdir, f"DESCRIBE {table}").rows]


def test_a_v3_file_reads_under_the_new_names_before_any_writer(v3_file):
    assert "budget_pages" in _columns(v3_file, "bin_stats")  # the file is as it was
    assert run_tables(v3_file, "r")["bin_stats"][0]["pages_read"] == 7
    [row] = study_tables(v3_file, "s1")["bin_stats"]
    assert row["pages_read"] == 7 and "budget_pages" not in row


def test_the_next_writer_renames_the_columns_and_keeps_the_rows(v3_file):
    Store.open_writer(v3_file).close()
    assert "pages_read" in _columns(v3_file, "bin_stats")
    assert "budget_pages" not in _columns(v3_file, "bin_stats")
    assert "topk_pages" in _columns(v3_file, "calibration")
    assert query(v3_file, "SELECT run_id, pages_read FROM bin_stats").rows == [("r", 7)]
    assert query(v3_file, "SELECT topk_pages, p5 FROM calibration").rows == [(4, 0.85)]
    version = query(v3_file, "SELECT value FROM meta WHERE key = 'schema_version'").rows
    assert version == [(str(SCHEMA_VERSION),)]
    # writes by the new name land, the key still holds, and a second open changes nothing
    with Store.open_writer(v3_file) as store, store.connect() as conn:
        replace_calibration(
            conn,
            "c",
            "m",
            [{"topk_pages": 8, "bin": 0, "n": 5, "p5": 0.9, "mean": 0.97, "p1": None, "p10": None}],
        )
    assert query(v3_file, "SELECT topk_pages, p5 FROM calibration").rows == [(8, 0.9)]
    assert run_tables(v3_file, "r")["bin_stats"][0]["pages_read"] == 7


def _tokens(path, column: str, value: int, step: int):
    path.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "run_id": ["r"],
                "step": pa.array([step], pa.int32()),
                column: pa.array([value], pa.int32()),
                "acceptance": [0.5],
            }
        ),
        path / "tokens.parquet",
    )


@pytest.mark.parametrize(
    "columns", [("budget_pages",), ("budget_pages", "pages_read"), ("pages_read",)]
)
def test_token_files_from_before_the_rename_read_as_pages_read(tmp_path, columns):
    Store.open_writer(tmp_path).close()
    for step, column in enumerate(columns, start=1):
        _tokens(
            tmp_path / "runs" / "r" / f"step-{step}" / "aggregate_mismatch", column, 10 * step, step
        )
    rows = query(tmp_path, "SELECT step, pages_read FROM token_mismatch ORDER BY step").rows
    assert rows == [(s, 10 * s) for s in range(1, len(columns) + 1)]
    assert "budget_pages" not in _columns(tmp_path, "token_mismatch")
