"""Storage errors. They subclass sparrow.errors' SparrowError so the CLI prints them as one line."""

from sparrow.errors import SparrowError


class StorageError(SparrowError):
    """A problem with the workdir's DuckDB file or artifacts; the message names the path."""


class WorkdirBusyError(StorageError):
    """Another process is the workdir's writer."""


class QueryRefusedError(StorageError):
    """A query that would write, attach or export; `sparrow query` only reads."""
