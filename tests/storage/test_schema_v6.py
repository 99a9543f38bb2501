"""Schema version 6 (issue 41, docs/async.md) adds the policy version that generated a
trajectory to sample_stats (with S over its sparse mismatch alone) and to the per-token files
(with the acceptance against that version's dense policy). A version 5 file reads before any
writer opens it (no such columns); the next writer adds them, its old rows NULL there. Token
files written before the columns give NULL in the token_mismatch view, alone or beside
newer files."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.storage import Store, query
from sparrow.storage.mismatch_rows import replace_sample_stats
from sparrow.storage.report_rows import sample_stats
from sparrow.storage.schema import SCHEMA_VERSION, TABLES, TOKEN_COLUMNS, V6_COLUMNS


def _v5_ddl(table: str) -> str:
    ddl = TABLES[table]
    for name, column, kind in V6_COLUMNS:
        if name == table:
            ddl = ddl.replace(f"{column} {kind}, ", "")
    return ddl


@pytest.fixture
def v5_file(tmp_path):
    conn = duckdb.connect(str(tmp_path / "sparrow.duckdb"))
    for name in TABLES:
        conn.execute(_v5_ddl(name))
    conn.execute("INSERT INTO meta VALUES ('schema_version', '5')")
    conn.execute(
        "INSERT INTO sample_stats (run_id, step, prompt, sample, tokens, mismatch_sum) "
        "VALUES ('r', 1, 0, 0, 4, 0.25)"
    )
    conn.close()
    return tmp_path


def test_the_fixture_is_a_version_5_file(v5_file):
    columns = {r[0] for r in query(v5_file, "DESCRIBE sample_stats").rows}
    assert "mismatch_sum" in columns and "policy_version" not in columns


def test_a_v5_file_reads_and_the_next_writer_adds_the_columns(v5_file):
    [old] = sample_stats(v5_file, "r")
    assert old["mismatch_sum"] == 0.25 and "policy_version" not in old
    with Store.open_writer(v5_file) as store, store.connect() as conn:
        row = dict(prompt=0, sample=1, tokens=2, mismatch_sum=0.5, log_weight=-0.1)
        replace_sample_stats(
            conn, "r", 2, [{**row, "policy_version": 0, "sparse_mismatch_sum": 0.2}]
        )
    rows = query(
        v5_file, "SELECT step, policy_version, sparse_mismatch_sum FROM sample_stats ORDER BY step"
    ).rows
    assert rows == [(1, None, None), (2, 0, 0.2)]
    version = query(v5_file, "SELECT value FROM meta WHERE key = 'schema_version'").rows
    assert version == [(str(SCHEMA_VERSION),)] == [("6",)]


def _tokens(workdir, step: int, version: int | None) -> None:
    path = workdir / "runs" / "r" / f"step-{step}" / "aggregate_mismatch"
    path.mkdir(parents=True)
    columns = {
        "run_id": ["r"],
        "step": pa.array([step], pa.int32()),
        "acceptance": [0.5],
    }
    if version is not None:
        columns["policy_version"] = pa.array([version], pa.int32())
        columns["sparse_acceptance"] = [0.75]
    pq.write_table(pa.table(columns), path / "tokens.parquet")


@pytest.mark.parametrize("versions", [(None,), (None, 0), (0, 0)])
def test_token_files_without_the_version_read_it_as_null(tmp_path, versions):
    Store.open_writer(tmp_path).close()
    for step, version in enumerate(versions, start=1):
        _tokens(tmp_path, step, version)
    rows = query(
        tmp_path,
        "SELECT step, policy_version, sparse_acceptance FROM token_mismatch ORDER BY step",
    ).rows
    assert rows == [(s, v, None if v is None else 0.75) for s, v in enumerate(versions, 1)]
    described = {r[0]: r[1] for r in query(tmp_path, "DESCRIBE token_mismatch").rows}
    assert described["policy_version"] == "INTEGER" == TOKEN_COLUMNS["policy_version"]
