"""The workdir's single writer.

One process at a time writes a workdir: `Store.open_writer` takes an exclusive lock file
(`<workdir>/sparrow.lock`, holding the writer's pid) for the life of the run, and a second
writer gets WorkdirBusyError naming that pid. DuckDB connections themselves are short: each
`connect()` opens the file, runs one transaction and closes it, so `sparrow query` can read
between writes while a run is going.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from sparrow.storage.errors import StorageError, WorkdirBusyError, interrupted
from sparrow.storage.layout import db_path, remove_stale_scratch
from sparrow.storage.schema import create_tables

LOCK_FILENAME = "sparrow.lock"
# DuckDB takes a file lock per connection; a reader holding it delays a write briefly
CONNECT_RETRY_S = 30.0


class Store:
    def __init__(self, workdir: Path, lock_fd: int):
        self.workdir = workdir
        self.path = db_path(workdir)
        self._lock_fd: int | None = lock_fd
        with self.connect() as conn:
            create_tables(conn)

    @classmethod
    def open_writer(cls, workdir: str | Path, wait_s: float = 0.0) -> Store:
        """Take the workdir; a busy one is tried again for up to `wait_s` seconds (for short
        writers such as a study's planning, which its arms' processes do at once)."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        lock_path = workdir / LOCK_FILENAME
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WorkdirBusyError(
                f"workdir {workdir} is being written by another process (pid {holder}); "
                f"wait for it to finish or use another pipeline.workdir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        # a writer killed outright left its scratch; no other writer can be using any now
        remove_stale_scratch(workdir)
        return cls(workdir, fd)

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction on a fresh connection: committed on success, rolled back on error."""
        if self._lock_fd is None:
            raise StorageError(f"store for {self.workdir} is closed")
        conn = _connect_with_retry(self.path, read_only=False)
        try:
            conn.execute("BEGIN TRANSACTION")
            yield conn
            conn.execute("COMMIT")
        except BaseException as err:
            conn.execute("ROLLBACK")
            if interrupted(err):  # Ctrl-C during a statement: stop as on any other Ctrl-C
                raise KeyboardInterrupt from err
            raise
        finally:
            conn.close()


def _connect_with_retry(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + CONNECT_RETRY_S
    while True:
        try:
            conn = duckdb.connect(str(path), read_only=read_only)
            # no progress bar: DuckDB draws it on stdout, into a table or CSV being printed
            conn.execute("SET enable_progress_bar = false")
            return conn
        except duckdb.IOException as err:
            if "lock" not in str(err).lower() or time.monotonic() > deadline:
                raise StorageError(f"cannot open {path}: {err}") from None
            time.sleep(0.1)
        except duckdb.Error as err:
            raise StorageError(f"{path} is not a readable DuckDB file: {err}") from None
