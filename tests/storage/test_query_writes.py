"""`sparrow query` cannot write: every statement that is not a plain read is refused with one
line naming it, and no file under the workdir changes (a hash of every file, before and after).
The two attacks that once worked are here (an EXPLAIN ANALYZE of a COPY over a step's
tokens.parquet, an import of a planted folder whose SQL files CREATE and COPY), and 35 more.
Run: `python -m pytest tests/storage/test_query_writes.py -q`."""

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.cli.main import main
from sparrow.storage import QueryRefusedError, RunLayout, Store, query, query_all
from sparrow.storage.query import _open_sandboxed


@pytest.fixture
def workdir(tmp_path):
    """A workdir with a bin_stats row, two steps of tokens, and a planted export folder under
    runs/ (readable by the connection) whose SQL would create a table and overwrite tokens."""
    work = tmp_path / "work"
    with Store.open_writer(work) as store, store.connect() as conn:
        conn.execute("INSERT INTO bin_stats (run_id, step, bin, n, p5) VALUES ('r1', 1, 0, 9, 0.8)")
        conn.execute("INSERT INTO runs (run_id, status) VALUES ('r1', 'finished')")
    layout = RunLayout(work, "r1")
    for step in (1, 2):
        path = layout.token_file(step)
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({"run_id": ["r1"] * 2, "step": [step] * 2}), path)
    planted = work / "runs" / "planted"
    planted.mkdir()
    (planted / "schema.sql").write_text("CREATE TABLE pwned (a INTEGER);\n")
    (planted / "load.sql").write_text(
        f"COPY (SELECT 1 AS a) TO '{layout.token_file(1)}' (FORMAT parquet);\n"
    )
    return work


def hashes(folder):
    """Every file under folder: its content hash, by path (a new or removed file shows too)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def attempts(work):
    tokens = RunLayout(work, "r1").token_file(1)
    runs, planted = work / "runs", work / "runs" / "planted"
    copy = f"COPY (SELECT 1 AS a) TO '{tokens}' (FORMAT parquet)"
    return [
        # the two that worked before
        f"EXPLAIN ANALYZE {copy}",
        f"PRAGMA import_database('{planted}')",
        # the same, spelled otherwise
        f"IMPORT DATABASE '{planted}'",
        f"PRAGMA \"import_database\"('{planted}')",
        f"explain analyze {copy.lower()}",
        f"/* a read */ EXPLAIN /* really */ ANALYZE -- yes\n {copy}",
        f"EXPLAIN (ANALYZE, FORMAT json) {copy}",
        f"EXPLAIN (ANALYZE) COPY bin_stats TO '{runs}/new.csv'",
        f"EXPLAIN {copy}",
        "EXPLAIN ANALYZE DELETE FROM bin_stats",
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        "EXPLAIN ANALYZE CHECKPOINT",
        f"SELECT 1; {copy}",
        # writes, imports and exports typed directly
        copy,
        f"COPY bin_stats TO '{runs}/bins.parquet'",
        f"EXPORT DATABASE '{runs}/export'",
        f"ATTACH '{runs}/new.duckdb' AS other",
        "ATTACH ':memory:' AS scratch",
        "DETACH sparrow",
        "CREATE OR REPLACE VIEW token_mismatch AS SELECT 1",
        "UPDATE bin_stats SET p5 = 1",
        "COMMENT ON TABLE bin_stats IS 'x'",
        f"PREPARE p AS {copy}",
        "PIVOT bin_stats ON bin USING sum(n)",
        "CHECKPOINT",
        "VACUUM",
        # extensions and settings
        "INSTALL httpfs",
        "LOAD parquet",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "RESET lock_configuration",
        f"SET profiling_output = '{runs}/profile.json'",
        "SET VARIABLE x = 1",
        "USE memory",
        # PRAGMAs outside the allow-list, and one that sets a value
        "PRAGMA enable_profiling",
        "PRAGMA force_checkpoint",
        "PRAGMA copy_database('sparrow', 'memory')",
        "PRAGMA table_info = 'bin_stats'",
        "CALL pragma_version()",
        "BEGIN TRANSACTION",
    ]


@pytest.mark.parametrize("index", range(40))
def test_a_statement_that_is_not_a_plain_read_is_refused_and_writes_nothing(workdir, index, capsys):
    sql = attempts(workdir)[index]
    before = hashes(workdir)
    with pytest.raises(QueryRefusedError) as err:
        query_all(workdir, sql)
    message = str(err.value)
    assert message.startswith("refused: ") and "\n" not in message
    assert main(["query", "--workdir", str(workdir), sql]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: refused: ")
    assert hashes(workdir) == before
    tables = query(workdir, "SELECT table_name FROM duckdb_tables() WHERE table_name = 'pwned'")
    assert tables.rows == []


def test_the_connection_alone_would_write_so_the_statement_check_must_hold(workdir):
    """Why the check is needed: runs/ is an allowed directory, for writes as much as reads."""
    tokens = RunLayout(workdir, "r1").token_file(1)
    before = tokens.read_bytes()
    conn, _ = _open_sandboxed(workdir)
    try:
        conn.execute(f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{tokens}' (FORMAT parquet)")
    finally:
        conn.close()
    assert tokens.read_bytes() != before


@pytest.mark.parametrize(
    "sql, rows",
    [
        ("SELECT count(*) FROM bin_stats", [(1,)]),
        ("FROM bin_stats SELECT p5", [(0.8,)]),
        ("WITH b AS (SELECT * FROM bin_stats) SELECT count(*) FROM b", [(1,)]),
        ("SELECT count(*) FROM token_mismatch", [(4,)]),
        ("EXPLAIN SELECT * FROM bin_stats", None),
        ("EXPLAIN ANALYZE SELECT * FROM token_mismatch", None),
        ("EXPLAIN (FORMAT json) SELECT 1", None),
        ("EXPLAIN (SELECT 1)", None),
        ("DESCRIBE bin_stats", None),
        ("SHOW TABLES", None),
        ("SUMMARIZE bin_stats", None),
        ("PRAGMA show_tables", None),
        ("PRAGMA table_info('bin_stats')", None),
        ("PRAGMA version", None),
    ],
)
def test_plain_reads_still_run_and_write_nothing(workdir, sql, rows):
    before = hashes(workdir)
    result = query(workdir, sql)
    assert result.rows == rows if rows is not None else result.rows
    assert hashes(workdir) == before
