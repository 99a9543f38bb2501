"""What Sparrow reads and writes of Prefect's own SQLite database (sparrow/flows/prefect_template.py
keeps an empty one to copy into new homes; Prefect itself does everything else):

    copy_empty_database(Path("~/.prefect/prefect.db"), Path("kept.db"))   # True: a copy made
    remove_database(Path("kept.db"))                                       # with its -wal, -shm
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path


def copy_empty_database(database: Path, copy: Path) -> bool:
    """SQLite's own backup of `database` (consistent while its server writes) into `copy`, one
    self-contained file (out of write-ahead mode); True when the copy holds a schema at one
    migration and no flow run, else False with nothing left at `copy`."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as source:
        with closing(sqlite3.connect(copy)) as target:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")
            empty = _empty_and_migrated(target)
    if not empty:
        remove_database(copy)
    return empty


def remove_database(path: Path) -> None:
    """A SQLite file and the write-ahead files SQLite may have left beside it."""
    for each in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        each.unlink(missing_ok=True)


def _empty_and_migrated(conn: sqlite3.Connection) -> bool:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "alembic_version" not in tables or "flow_run" not in tables:
        return False
    if conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] != 1:
        return False
    return conn.execute("SELECT count(*) FROM flow_run").fetchone()[0] == 0
