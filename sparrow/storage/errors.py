"""Storage errors. They subclass sparrow.errors' SparrowError so the CLI prints them as one line."""

import duckdb

from sparrow.errors import SparrowError


class StorageError(SparrowError):
    """A problem with the workdir's DuckDB file or artifacts; the message names the path."""


class WorkdirBusyError(StorageError):
    """Another process is the workdir's writer."""


class QueryRefusedError(StorageError):
    """A query that would write, attach or export; `sparrow query` only reads."""


def interrupted(err: BaseException) -> bool:
    """Whether `err` is DuckDB's report of a Ctrl-C: a SIGINT that arrives while a statement
    runs is turned by DuckDB into `RuntimeError: Query interrupted` (or its InterruptException),
    not the KeyboardInterrupt the rest of the program stops on. Callers re-raise it as one."""
    if isinstance(err, duckdb.InterruptException):
        return True
    return type(err) is RuntimeError and str(err).strip() == "Query interrupted"
