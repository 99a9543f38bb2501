"""`sparrow query` stays inside its workdir: every way out that was tried answers with a
refusal, while the workdir's tables, the token_mismatch view and its Parquet files still
read; several statements each give their result; a damaged Parquet file is skipped with a
warning naming it."""

import json
import warnings

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.cli.main import main
from sparrow.storage import DamagedFileWarning, RunLayout, StorageError, Store, query, query_all
from sparrow.storage.query import _open_sandboxed

SECRET = "root:x:0:0:the secret line"


@pytest.fixture
def workdir(tmp_path):
    """A workdir with a bin_stats row and two steps of tokens, and a secret file beside it."""
    work = tmp_path / "work"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text(f"line\n{SECRET}\n")
    with Store.open_writer(work) as store, store.connect() as conn:
        conn.execute("INSERT INTO bin_stats (run_id, step, bin, n, p5) VALUES ('r1', 1, 0, 9, 0.8)")
        conn.execute("INSERT INTO runs (run_id, status) VALUES ('r1', 'finished')")
    layout = RunLayout(work, "r1")
    for step in (1, 2, 3):
        path = layout.token_file(step)
        path.parent.mkdir(parents=True)
        pq.write_table(
            pa.table({"run_id": ["r1"] * 2, "step": [step] * 2, "acceptance": [0.5, 0.9]}), path
        )
    return work


def escapes(work):
    outside = work.parent / "outside"
    return [
        f"SELECT * FROM read_csv('{outside}/secret.csv')",
        "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT content FROM read_text('{outside}/secret.csv')",
        "SELECT content FROM read_text('/etc/hostname')",
        f"SELECT content FROM read_blob('{outside}/secret.csv')",
        "SELECT * FROM glob('/root/*')",
        f"SELECT * FROM glob('{outside}/*')",
        # up and out of the allowed folder
        f"SELECT * FROM read_csv('{work}/runs/../../outside/secret.csv')",
        f"SELECT * FROM read_csv_auto('{outside}/secret.csv')",
        f"SELECT * FROM sniff_csv('{outside}/secret.csv')",
        f"SELECT * FROM read_json('{outside}/secret.csv')",
        "SELECT * FROM read_csv('https://example.com/x.csv')",
    ]


@pytest.mark.parametrize("index", range(12))
def test_no_file_outside_the_workdir_is_read(workdir, index):
    sql = escapes(workdir)[index]
    with pytest.raises(StorageError) as err:
        query(workdir, sql)
    assert SECRET not in str(err.value)
    assert "disabled by configuration" in str(err.value) or "Permission" in str(err.value)


def test_the_fence_cannot_be_taken_down_from_inside(workdir):
    """The statement check refuses SET, but the connection holds on its own too."""
    conn, _ = _open_sandboxed(workdir)
    try:
        for sql in (
            "SET enable_external_access = true",
            "RESET allowed_directories",
            "SET allowed_directories = ['/']",
            "SET lock_configuration = false",
        ):
            with pytest.raises(duckdb.Error, match="locked"):
                conn.execute(sql)
        with pytest.raises(duckdb.Error, match="disabled"):
            conn.execute("LOAD httpfs")
    finally:
        conn.close()


def test_the_workdir_still_reads(workdir):
    assert query(workdir, "SELECT run_id, p5 FROM bin_stats").rows == [("r1", 0.8)]
    rows = query(workdir, "SELECT step, count(*) FROM token_mismatch GROUP BY step ORDER BY step")
    assert rows.rows == [(1, 2), (2, 2), (3, 2)]
    own = RunLayout(workdir, "r1").token_file(2)
    assert query(workdir, f"SELECT count(*) FROM read_parquet('{own}')").rows == [(2,)]
    pattern = f"{workdir}/runs/*/step-*/aggregate_mismatch/tokens.parquet"
    assert query(workdir, f"SELECT count(*) FROM glob('{pattern}')").rows == [(3,)]


def test_every_statement_gives_its_result(workdir, capsys):
    results = query_all(workdir, "SELECT 1 AS a; SELECT 2 AS b, 3 AS c")
    assert [(r.columns, r.rows) for r in results] == [(["a"], [(1,)]), (["b", "c"], [(2, 3)])]
    with pytest.raises(StorageError, match="one statement"):
        query(workdir, "SELECT 1; SELECT 2")

    assert (
        main(["query", "--workdir", str(workdir), "SELECT 11 AS first; SELECT 22 AS second"]) == 0
    )
    out = capsys.readouterr().out
    assert "11" in out and "22" in out and "SELECT 11" in out and "SELECT 22" in out
    assert main(["query", "--workdir", str(workdir), "--json", "SELECT 1 AS a; SELECT 2 AS b"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"statement": "SELECT 1 AS a", "rows": [{"a": 1}]},
        {"statement": "SELECT 2 AS b", "rows": [{"b": 2}]},
    ]


def test_json_carries_timestamps(workdir, capsys):
    assert (
        main(
            [
                "query",
                "--workdir",
                str(workdir),
                "--json",
                "SELECT run_id, created_at, TIMESTAMP '2026-01-02 03:04:05' AS t, DATE '2026-01-02' AS d,"
                " 1.5::DECIMAL(4, 2) AS x FROM runs",
            ]
        )
        == 0
    )
    [row] = json.loads(capsys.readouterr().out)
    assert row["t"] == "2026-01-02T03:04:05" and row["d"] == "2026-01-02" and row["x"] == 1.5
    assert row["created_at"][:2] == "20" and "T" in row["created_at"]


def test_a_damaged_parquet_file_is_skipped_with_a_warning(workdir, capsys):
    damaged = RunLayout(workdir, "r1").token_file(2)
    damaged.write_bytes(b"PAR1 cut short")
    with pytest.warns(DamagedFileWarning, match=str(damaged)):
        result = query(workdir, "SELECT DISTINCT step FROM token_mismatch ORDER BY step")
    assert result.rows == [(1,), (3,)]
    assert [(d.run_id, d.step) for d in result.damaged] == [("r1", 2)]
    # the tables do not depend on the files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedFileWarning)
        assert query(workdir, "SELECT count(*) FROM bin_stats").rows == [(1,)]

    assert (
        main(["query", "--workdir", str(workdir), "SELECT count(*) AS n FROM token_mismatch"]) == 0
    )
    captured = capsys.readouterr()
    assert "4" in captured.out
    [line] = captured.err.strip().splitlines()
    assert line.startswith("warning: skipped damaged Parquet file") and str(damaged) in line
