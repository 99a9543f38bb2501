"""Read-only SQL over a workdir: what `sparrow query` runs.

    result = query(workdir, "SELECT * FROM bin_stats WHERE p5 < ?", [0.86])   # one statement
    results = query_all(workdir, "SELECT 1; SELECT 2")                          # one per statement

Two fences. Before anything runs, every statement must be a plain read as DuckDB's own parser
sees it (sparrow/storage/sql_guard.py: SELECT, EXPLAIN [ANALYZE] of a SELECT, allow-listed
PRAGMAs); anything that would write, attach, import, export or change settings is refused.
Then the connection itself is a sandbox: the DuckDB file is opened read-only, external access
is off except for the workdir's runs/ folder (the per-token Parquet files:
`allowed_directories`), and the configuration is locked, so no statement can read
/etc/passwd, list /root, load an extension or turn the fence off. allowed_directories lets a
statement write under runs/ as well as read, so there the statement check is the fence
against writes. The view `token_mismatch` over the readable Parquet files is made for each
connection; damaged files are left out with a warning (sparrow.storage.token_files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from sparrow.storage.errors import StorageError, interrupted
from sparrow.storage.layout import db_path
from sparrow.storage.schema import token_view_sql
from sparrow.storage.sql_guard import check_read_only
from sparrow.storage.store import _connect_with_retry
from sparrow.storage.token_files import Damaged, find_token_files


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    statement: str = ""
    # Parquet files left out of token_mismatch because they could not be read
    damaged: tuple[Damaged, ...] = ()

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


def query(workdir: str | Path, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
    """Run one read-only statement against the workdir's DuckDB file; its rows."""
    statements = check_read_only(sql)
    if len(statements) > 1:
        raise StorageError(
            f"query() runs one statement, got {len(statements)}; use query_all() for several"
        )
    return query_all(workdir, sql, params)[0]


def query_all(
    workdir: str | Path, sql: str, params: Sequence[Any] | None = None
) -> list[QueryResult]:
    """Run every read-only statement of `sql` in order; one result per statement."""
    statements = check_read_only(sql)
    if params and len(statements) > 1:
        raise StorageError("query parameters need a single statement")
    conn, damaged = _open_sandboxed(workdir)
    try:
        results = []
        for statement in statements:
            cursor = conn.execute(statement, params or None)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = cursor.fetchall() if columns else []
            results.append(
                QueryResult(columns, rows, statement.strip().rstrip(";").strip(), damaged)
            )
        return results
    except Exception as err:
        if interrupted(err):  # Ctrl-C during a statement: stop as on any other Ctrl-C
            raise KeyboardInterrupt from err
        if isinstance(err, duckdb.Error):
            raise StorageError(f"query failed: {err}") from None
        raise
    finally:
        conn.close()


def _open_sandboxed(workdir: str | Path) -> tuple[duckdb.DuckDBPyConnection, tuple[Damaged, ...]]:
    path = db_path(workdir)
    if not path.is_file():
        raise StorageError(
            f"no mismatch history at {path}: run `sparrow train pipeline.workdir={workdir}` first"
        )
    files = find_token_files(workdir)
    conn = _connect_with_retry(path, read_only=True)
    try:
        conn.execute(
            token_view_sql(
                [str(p) for p in files.readable],
                frozenset(str(p) for p in files.old_columns),
                frozenset(files.columns),
            )
        )
        # allowed_directories can only be set once the database is open, before access is cut
        runs = str(Path(workdir).resolve() / "runs") + "/"
        conn.execute("SET allowed_directories = ?", [[runs]])
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
    except duckdb.Error as err:
        conn.close()
        raise StorageError(f"cannot open {path} for reading: {err}") from None
    return conn, tuple(files.damaged)
