"""The statement check of `sparrow query`: only plain reads pass, judged by DuckDB's own parser.

    from sparrow.storage.sql_guard import check_read_only
    statements = check_read_only("SELECT 1; EXPLAIN ANALYZE SELECT 2")   # their texts, in order
    check_read_only("EXPLAIN ANALYZE COPY (SELECT 1) TO 'x'")           # QueryRefusedError

A statement passes when DuckDB parses it (duckdb.extract_statements) as one of:
- SELECT (with WITH, VALUES, FROM-first, TABLE, DESCRIBE, SHOW and SUMMARIZE, which DuckDB
  parses as SELECT);
- EXPLAIN or EXPLAIN ANALYZE (or EXPLAIN (options)) whose explained statement, parsed again,
  is itself a SELECT: EXPLAIN ANALYZE runs what it explains, so EXPLAIN ANALYZE COPY would write;
- PRAGMA of a name in READ_PRAGMAS, with no `= value`: import_database (what `IMPORT DATABASE`
  becomes) runs the statements of a folder's SQL files, enable_profiling writes a file, so every
  other PRAGMA is refused.
Everything else (INSERT, COPY, EXPORT, ATTACH, LOAD/INSTALL, SET/RESET/USE, CALL, CREATE,
PREPARE/EXECUTE, PIVOT's several statements, ...) is refused, naming the statement. The
connection's own fence (sparrow/storage/query.py) still holds behind this check.
Tests: tests/storage/test_query_writes.py.
"""

from __future__ import annotations

import duckdb

from sparrow.storage.errors import QueryRefusedError, StorageError

READ_PRAGMAS = frozenset(
    {
        "collations",
        "database_list",
        "database_size",
        "functions",
        "metadata_info",
        "platform",
        "show",
        "show_databases",
        "show_tables",
        "show_tables_expanded",
        "storage_info",
        "table_info",
        "user_agent",
        "version",
    }
)
ALLOWED = (
    "sparrow query runs only SELECT (DESCRIBE, SHOW, SUMMARIZE), EXPLAIN [ANALYZE] of a SELECT, "
    "and PRAGMA " + ", ".join(sorted(READ_PRAGMAS))
)


def check_read_only(sql: str) -> list[str]:
    """Split `sql` into statements; refuse it whole if any statement is not a plain read."""
    statements = _parse(sql)
    if not statements:
        raise StorageError("no SQL statement given")
    for statement in statements:
        _check_statement(statement)
    return [s.query for s in statements]


def _parse(sql: str) -> list:
    try:
        return duckdb.extract_statements(sql)
    except (duckdb.Error, ValueError) as err:
        # ValueError: a statement type this duckdb's Python enum does not know
        raise StorageError(f"SQL does not parse: {err}") from None


def _check_statement(statement) -> None:
    kind = statement.type
    if kind == duckdb.StatementType.SELECT:
        return
    words = _words(statement.query)
    if kind == duckdb.StatementType.EXPLAIN and words[:1] == ["EXPLAIN"]:
        _check_explained(statement.query)
        return
    if kind == duckdb.StatementType.PRAGMA and words[:1] == ["PRAGMA"]:
        _check_pragma(statement.query)
        return
    # IMPORT DATABASE parses as a PRAGMA (import_database): name what was typed
    label = " ".join(words[:2]) if kind == duckdb.StatementType.PRAGMA else kind.name
    _refuse(f"a {label} statement", statement.query)


def _check_explained(text: str) -> None:
    """EXPLAIN [ANALYZE | (options)] STATEMENT: STATEMENT must parse as one SELECT."""
    tokens = _tokens(text)
    for start in _explained_starts(text, tokens):
        try:
            inner = duckdb.extract_statements(text[start:])
        except (duckdb.Error, ValueError):
            continue
        if len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT:
            return
        kind = inner[0].type.name if len(inner) == 1 else f"{len(inner)} statements"
        _refuse(f"EXPLAIN of {kind}", text)
    _refuse("an EXPLAIN whose statement cannot be told", text)


def _explained_starts(text: str, tokens: list[tuple[int, str]]) -> list[int]:
    """Where the explained statement may start: after EXPLAIN, after EXPLAIN ANALYZE, or after
    EXPLAIN's parenthesised options (`EXPLAIN (SELECT 1)` is a parenthesised SELECT)."""
    starts = []
    index = 1
    if index < len(tokens) and tokens[index][1].upper() in ("ANALYZE", "ANALYSE"):
        index += 1
    if index < len(tokens):
        starts.append(tokens[index][0])
        if tokens[index][1] == "(":
            depth = 0
            for position, word in tokens[index:]:
                depth += {"(": 1, ")": -1}.get(word, 0)
                if depth == 0:
                    starts.append(position + 1)
                    break
    return starts


def _check_pragma(text: str) -> None:
    tokens = _tokens(text)
    name = tokens[1][1].strip('"').lower() if len(tokens) > 1 else ""
    if name not in READ_PRAGMAS:
        _refuse(f"PRAGMA {name or '(none)'}", text)
    if any(word == "=" for _, word in tokens[2:]):
        _refuse(f"a PRAGMA {name} that sets a value", text)


def _tokens(text: str) -> list[tuple[int, str]]:
    """(position, text) of each token, comments left out."""
    found = duckdb.tokenize(text)
    ends = [position for position, _ in found[1:]] + [len(text)]
    return [
        (position, text[position:end].strip())
        for (position, kind), end in zip(found, ends)
        if kind != duckdb.token_type.comment
    ]


def _words(text: str) -> list[str]:
    return [word.upper() for _, word in _tokens(text)]


def _refuse(what: str, text: str) -> None:
    raise QueryRefusedError(
        f"refused: {what} ({' '.join(text.split())[:80]!r}); {ALLOWED} (docs/storage.md)"
    )
