"""Schema version 5 (issue 36) adds the bootstrap bounds, the bin floor (samples, counted) and
the acceptance estimator to bin_stats, calibration and threshold_events, and the sample_stats
table. A version 4 file reads before any writer opens it (new columns as None, no per-sample
rows); the next writer adds the columns, its old rows NULL there, and an old bin (counted NULL)
still counts for the controller's history."""

from __future__ import annotations

import duckdb
import pytest

from sparrow.storage import Store, query
from sparrow.storage.mismatch_rows import (
    BIN_COLUMNS,
    replace_bin_stats,
    replace_sample_stats,
    replace_threshold_events,
    statistic_history,
)
from sparrow.storage.report_rows import run_tables, sample_stats
from sparrow.storage.schema import SCHEMA_VERSION, TABLES, V5_COLUMNS
from sparrow.storage.study_rows import study_tables


def _v4_ddl(table: str) -> str:
    ddl = TABLES[table]
    for name, column, kind in V5_COLUMNS:
        if name == table:
            ddl = ddl.replace(f"{column} {kind}, ", "").replace(f"{column} {kind},", "")
    return ddl


@pytest.fixture
def v4_file(tmp_path):
    conn = duckdb.connect(str(tmp_path / "sparrow.duckdb"))
    for name in TABLES:
        if name != "sample_stats":
            conn.execute(_v4_ddl(name))
    conn.execute("INSERT INTO meta VALUES ('schema_version', '4')")
    conn.execute(
        "INSERT INTO bin_stats (run_id, step, bin, n, mean, p5, pages_read, schedule_name, "
        "schedule_version) VALUES ('r', 1, 0, 10, 0.9, 0.8, 7, 's', 1)"
    )
    conn.execute(
        "INSERT INTO threshold_events (run_id, step, bin, kind, p5, target) "
        "VALUES ('r', 1, 0, 'below_target', 0.8, 0.86)"
    )
    conn.execute(
        "INSERT INTO study_arms (study_id, arm, arm_index, run_id) VALUES ('s1', 'dense', 0, 'r')"
    )
    conn.close()
    return tmp_path


def test_the_fixture_is_a_version_4_file(v4_file):
    columns = {r[0] for r in query(v4_file, "DESCRIBE bin_stats").rows}
    assert "p5_lo" not in columns and "counted" not in columns


def test_a_v4_file_reads_before_any_writer(v4_file):
    tables = run_tables(v4_file, "r")
    [row] = tables["bin_stats"]
    assert row["p5"] == 0.8 and row["p5_lo"] is None and row["counted"] is None
    assert tables["threshold_events"][0]["estimator"] is None
    assert tables["sample_stats"] == [] == sample_stats(v4_file, "r")
    assert study_tables(v4_file, "s1")["bin_stats"][0]["p5"] == 0.8


def test_the_next_writer_adds_the_columns_and_old_rows_still_count(v4_file):
    with Store.open_writer(v4_file) as store, store.connect() as conn:
        assert statistic_history(conn, "r", "p5", 1) == [(1, 0, 0.8)]  # counted NULL: counts
        row = dict.fromkeys(BIN_COLUMNS)
        row.update(bin=0, n=100, mean=0.9, p5=0.2, counted=False, p5_lo=0.1, p5_hi=0.3)
        replace_bin_stats(conn, "r", 2, [row])
        assert statistic_history(conn, "r", "p5", 2) == [(1, 0, 0.8)]  # below the floor
        replace_threshold_events(conn, "r", 2, [(0, "below_target", 0.7, 0.86)], "exact")
        replace_sample_stats(
            conn,
            "r",
            2,
            [dict(prompt=0, sample=1, tokens=3, mismatch_sum=0.5, log_weight=-0.1)],
        )
    rows = query(v4_file, "SELECT step, p5_lo, p5_hi, counted FROM bin_stats ORDER BY step").rows
    assert rows == [(1, None, None, None), (2, 0.1, 0.3, False)]
    [event] = [e for e in run_tables(v4_file, "r")["threshold_events"] if e["step"] == 2]
    assert event["estimator"] == "exact"
    [sample] = sample_stats(v4_file, "r")
    assert sample["mismatch_sum"] == 0.5 and sample["lookup_mismatch_sum"] is None
    version = query(v4_file, "SELECT value FROM meta WHERE key = 'schema_version'").rows
    assert version == [(str(SCHEMA_VERSION),)] and SCHEMA_VERSION >= 5  # 6 added sample columns
