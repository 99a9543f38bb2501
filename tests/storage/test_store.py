"""The workdir store: single writer, transactions, read-only queries, atomic layout."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.cli.main import main
from sparrow.storage import (
    QueryRefusedError,
    RunLayout,
    StorageError,
    Store,
    atomic_dir,
    query,
)
from sparrow.storage.schema import SCHEMA_VERSION


@pytest.fixture
def store(tmp_path):
    with Store.open_writer(tmp_path) as s:
        yield s


def _add_bins(store, rows):
    with store.connect() as conn:
        conn.executemany(
            "INSERT INTO bin_stats (run_id, step, bin, n, p5) VALUES (?, ?, ?, ?, ?)", rows
        )


def test_query_answers_a_question(store, tmp_path):
    _add_bins(
        store, [("r1", s, b, 100, 0.80 + 0.01 * s + 0.02 * b) for s in range(4) for b in range(3)]
    )
    result = query(tmp_path, "SELECT step, bin FROM bin_stats WHERE p5 < 0.86 ORDER BY step, bin")
    # p5 = 0.80 + 0.01 step + 0.02 bin < 0.86
    expected = [
        (s, b) for s in range(4) for b in range(3) if 0.80 + 0.01 * s + 0.02 * b < 0.86 - 1e-12
    ]
    assert result.rows == expected
    assert result.columns == ["step", "bin"]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM bin_stats",
        "INSERT INTO runs (run_id) VALUES ('x')",
        "DROP TABLE runs",
        "SELECT 1; UPDATE bin_stats SET p5 = 1",
        "COPY bin_stats TO 'out.csv'",
        "ATTACH 'other.duckdb'",
        "CREATE TABLE t (a INT)",
    ],
)
def test_query_refuses_writes(store, tmp_path, sql):
    _add_bins(store, [("r1", 0, 0, 10, 0.9)])
    with pytest.raises(QueryRefusedError, match="refused"):
        query(tmp_path, sql)
    assert query(tmp_path, "SELECT count(*) FROM bin_stats").rows == [(1,)]


def test_failed_transaction_rolls_back(store, tmp_path):
    with pytest.raises(RuntimeError):
        with store.connect() as conn:
            conn.execute("INSERT INTO step_metrics VALUES ('r', 0, 'reward', 1.0)")
            raise RuntimeError("stage crashed")
    assert query(tmp_path, "SELECT count(*) FROM step_metrics").rows == [(0,)]


def test_second_writer_in_another_process_is_refused(store, tmp_path):
    code = (
        "import sys; from sparrow.storage import Store, WorkdirBusyError\n"
        "try:\n    Store.open_writer(sys.argv[1])\nexcept WorkdirBusyError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 3, out.stderr
    assert "being written by another process" in out.stdout and str(tmp_path) in out.stdout


def test_writer_lock_is_released_on_close(tmp_path):
    Store.open_writer(tmp_path).close()
    Store.open_writer(tmp_path).close()


def test_token_view_reads_parquet_files(store, tmp_path):
    layout = RunLayout(tmp_path, "r1")
    for step in (0, 1):
        path = layout.token_file(step)
        path.parent.mkdir(parents=True)
        table = pa.table(
            {
                "run_id": ["r1"] * 3,
                "step": [step] * 3,
                "position": [1, 2, 3],
                "acceptance": [0.5, 0.9, 1.0],
            }
        )
        pq.write_table(table, path)
    rows = query(
        tmp_path,
        "SELECT step, count(*), min(acceptance) FROM token_mismatch GROUP BY step ORDER BY step",
    ).rows
    assert rows == [(0, 3, 0.5), (1, 3, 0.5)]


def test_missing_db_is_a_clear_error(tmp_path):
    with pytest.raises(StorageError, match="no mismatch history"):
        query(tmp_path / "nowhere", "SELECT 1")


def test_corrupt_db_is_a_clear_error(tmp_path):
    (tmp_path / "sparrow.duckdb").write_bytes(b"not a database" * 100)
    with pytest.raises(StorageError, match="sparrow.duckdb"):
        query(tmp_path, "SELECT 1")


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "step-0" / "rollout"
    with pytest.raises(ValueError):
        with atomic_dir(final) as scratch:
            (scratch / "part.bin").write_bytes(b"x")
            raise ValueError("died mid-write")
    assert not final.exists() and list(final.parent.iterdir()) == []
    with atomic_dir(final) as scratch:
        (scratch / "done.txt").write_text("ok")
    assert (final / "done.txt").read_text() == "ok"


def test_cli_query_json_and_refusal(store, tmp_path, capsys):
    _add_bins(store, [("r1", 3, 0, 10, 0.81)])
    assert (
        main(["query", "--workdir", str(tmp_path), "--json", "SELECT run_id, p5 FROM bin_stats"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"run_id": "r1", "p5": 0.81}]
    assert main(["query", "--workdir", str(tmp_path), "DELETE FROM bin_stats"]) == 2
    assert "refused" in capsys.readouterr().err


def test_older_calibration_table_gains_the_new_columns(tmp_path):
    import duckdb

    conn = duckdb.connect(str(tmp_path / "sparrow.duckdb"))
    conn.execute(
        "CREATE TABLE calibration (calibration_id VARCHAR, model_path VARCHAR, "
        "budget_pages INTEGER, bin INTEGER, n BIGINT, p5 DOUBLE, mean DOUBLE, "
        "created_at TIMESTAMP, PRIMARY KEY (calibration_id, budget_pages, bin))"
    )
    conn.execute("INSERT INTO calibration VALUES ('c', 'm', 8, 0, 10, 0.9, 0.99, NULL)")
    conn.close()
    Store.open_writer(tmp_path).close()
    rows = query(tmp_path, "SELECT p5, p1, p10 FROM calibration").rows
    assert rows == [(0.9, None, None)]


def test_older_bin_stats_stays_readable_and_gains_min_and_share(tmp_path):
    import duckdb

    from sparrow.storage.mismatch_rows import BIN_COLUMNS, replace_bin_stats

    # bin_stats as schema version 2 wrote it
    conn = duckdb.connect(str(tmp_path / "sparrow.duckdb"))
    conn.execute(
        "CREATE TABLE bin_stats (run_id VARCHAR, step INTEGER, bin INTEGER, n BIGINT, "
        "mean DOUBLE, p1 DOUBLE, p5 DOUBLE, p10 DOUBLE, p50 DOUBLE, beta_a DOUBLE, "
        "beta_b DOUBLE, beta_var DOUBLE, ks DOUBLE, budget_pages INTEGER, "
        "schedule_name VARCHAR, schedule_version INTEGER, "
        "PRIMARY KEY (run_id, step, bin))"
    )
    conn.execute(
        "INSERT INTO bin_stats VALUES ('old', 1, 0, 10, 0.99, 0.5, 0.8, 0.9, 1.0, NULL, "
        "NULL, NULL, NULL, 4, 's', 1)"
    )
    conn.close()
    # a reader before any writer opened it: the old columns, as they were
    assert query(tmp_path, "SELECT run_id, p5 FROM bin_stats").rows == [("old", 0.8)]
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        replace_bin_stats(
            conn,
            "new",
            1,
            [
                dict(
                    zip(
                        BIN_COLUMNS,
                        [
                            0,
                            10,
                            0.99,
                            0.5,
                            0.8,
                            0.9,
                            1.0,
                            None,
                            None,
                            None,
                            None,
                            4,
                            "s",
                            1,
                            0.25,
                            0.1,
                        ],
                    )
                )
            ],
        )
    rows = query(
        tmp_path, "SELECT run_id, p5, min, share_below_half FROM bin_stats ORDER BY run_id"
    ).rows
    assert rows == [("new", 0.8, 0.25, 0.1), ("old", 0.8, None, None)]
    pages = query(tmp_path, "SELECT run_id, pages_read FROM bin_stats ORDER BY run_id").rows
    assert pages == [("new", 4), ("old", 4)]
    version = query(tmp_path, "SELECT value FROM meta WHERE key = 'schema_version'").rows
    assert version == [(str(SCHEMA_VERSION),)]


def test_the_next_writer_removes_a_dead_writers_scratch(tmp_path):
    """kill -9 in the middle of a stage leaves `.rollout.tmp-<pid>`; the next writer removes
    it, and leaves a live process's scratch and every finished folder alone."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    step = RunLayout(tmp_path, "r1").step_dir(2)
    (step / f".rollout.tmp-{dead_pid}").mkdir(parents=True)
    (step / f".rollout.tmp-{dead_pid}" / "part.parquet").write_bytes(b"x")
    (step / f".tokens.parquet.tmp-{dead_pid}").write_bytes(b"x")
    (step / "reward").mkdir()
    (step / "reward" / "rewards.parquet").write_bytes(b"done")
    live = step / f".reward.tmp-{os.getppid()}"
    live.mkdir()
    Store.open_writer(tmp_path).close()
    assert sorted(p.name for p in step.iterdir()) == [live.name, "reward"]
    assert (step / "reward" / "rewards.parquet").read_bytes() == b"done"


# seconds of work for DuckDB, so a Ctrl-C lands inside it (and a missed one fails in seconds)
SLOW_SQL = "SELECT count(*) FROM range(3000000000) t(a) WHERE a % 7 = 3"


@pytest.fixture
def ctrl_c_in():
    """ctrl_c_in(seconds): SIGINT to this process then, with Python's own SIGINT handler in
    place (a test worker may have inherited SIGINT ignored); the handler is put back after."""
    import signal
    import threading

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = []

    def arm(seconds: float) -> None:
        timers.append(threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT)))
        timers[-1].start()

    yield arm
    for timer in timers:
        timer.join()
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_statement_is_a_keyboard_interrupt_and_rolls_back(
    store, tmp_path, ctrl_c_in
):
    """DuckDB turns a SIGINT that arrives while a statement runs into `RuntimeError: Query
    interrupted`; the store and `query` stop on it as on any Ctrl-C, writing nothing."""
    _add_bins(store, [("r1", 0, 0, 10, 0.9)])
    ctrl_c_in(0.3)
    with pytest.raises(KeyboardInterrupt):
        with store.connect() as conn:
            conn.execute("DELETE FROM bin_stats")
            conn.execute(SLOW_SQL).fetchall()
    assert query(tmp_path, "SELECT count(*) FROM bin_stats").rows == [(1,)]
    ctrl_c_in(0.3)
    with pytest.raises(KeyboardInterrupt):
        query(tmp_path, SLOW_SQL)
