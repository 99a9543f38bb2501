"""Storage owns its SQL: outside sparrow/storage/, no module runs a statement on a connection.

Read from source with ast, never executed: a call of `.execute(...)`, `.executemany(...)` or
`.sql(...)` anywhere in sparrow/ outside sparrow/storage/, or in benchmarks/, fails
naming the file and line; such a statement belongs in a sparrow/storage/*_rows.py function.
(`sparrow query` passes the user's SQL to sparrow.storage.query_all, which is not a statement of the
project's own.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("sparrow", "benchmarks")
STORAGE = ROOT / "sparrow" / "storage"
STATEMENT_CALLS = {"execute", "executemany", "sql"}


def statement_calls(source: str, name: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source, name))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in STATEMENT_CALLS
    ]


def test_no_sql_statement_outside_storage():
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for top in SEARCHED
        for path in sorted((ROOT / top).rglob("*.py"))
        if "__pycache__" not in path.parts and STORAGE not in path.parents
        for line in statement_calls(path.read_text(), str(path))
    ]
    assert not bad, (
        "SQL outside sparrow/storage/ (move it behind a sparrow/storage/*_rows.py function):\n"
        + "\n".join(bad)
    )


def test_the_check_sees_a_statement():
    source = "def f(conn):\n    conn.execute('DELETE FROM runs')\n    return 1\n"
    assert statement_calls(source, "probe") == [2]
    assert statement_calls("x = query(workdir, sql)\n", "probe") == []
