"""Read-only SQL over a workdir: what `sparrow query` runs.

The DuckDB file is opened read-only and every statement must be a read (SELECT, EXPLAIN,
DESCRIBE/SHOW, PRAGMA); anything that would write, attach, export or change settings is
refused before it runs. The view `token_mismatch` over the per-token Parquet files is made
for each connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import duckdb

from storage.errors import QueryRefusedError, StorageError
from storage.layout import db_path
from storage.schema import TOKEN_FILE_GLOB, token_view_sql
from storage.store import _connect_with_retry

_READ_STATEMENTS = {
    duckdb.StatementType.SELECT,
    duckdb.StatementType.EXPLAIN,
    duckdb.StatementType.PRAGMA,
}


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


def check_read_only(sql: str) -> list[str]:
    """Split `sql` into statements; refuse it whole if any statement is not a read."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as err:
        raise StorageError(f"SQL does not parse: {err}") from None
    if not statements:
        raise StorageError("no SQL statement given")
    for statement in statements:
        if statement.type not in _READ_STATEMENTS:
            kind = statement.type.name
            raise QueryRefusedError(
                f"refused: {kind} statement ({statement.query.strip()[:60]!r}); "
                f"sparrow query only reads (SELECT, EXPLAIN, DESCRIBE, SHOW)"
            )
        if statement.type == duckdb.StatementType.PRAGMA and "=" in statement.query:
            raise QueryRefusedError("refused: a PRAGMA that sets a value; sparrow query only reads")
    return [s.query for s in statements]


def query(workdir: str | Path, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
    """Run read-only `sql` against the workdir's DuckDB file; the last statement's rows."""
    statements = check_read_only(sql)
    path = db_path(workdir)
    if not path.is_file():
        raise StorageError(
            f"no mismatch history at {path}: run `sparrow train pipeline.workdir={workdir}` first"
        )
    conn = _connect_with_retry(path, read_only=True)
    try:
        has_files = any(Path(workdir).glob(TOKEN_FILE_GLOB))
        conn.execute(token_view_sql(str(Path(workdir).resolve()), has_files))
        result = None
        for i, statement in enumerate(statements):
            last = i == len(statements) - 1
            result = conn.execute(statement, params if last and params else None)
        columns = [d[0] for d in result.description] if result.description else []
        return QueryResult(columns, result.fetchall() if columns else [])
    except duckdb.Error as err:
        raise StorageError(f"query failed: {err}") from None
    finally:
        conn.close()
