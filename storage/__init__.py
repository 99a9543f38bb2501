"""Storage: the DuckDB mismatch history and the on-disk artifact layout (no torch here).

    store = Store.open_writer(workdir)        # one writer per workdir, held for a run
    with store.connect() as conn: conn.execute("INSERT ...")
    rows = query(workdir, "SELECT * FROM bin_stats WHERE p5 < 0.86")   # read-only
"""

from storage.errors import StorageError, WorkdirBusyError, QueryRefusedError
from storage.layout import RunLayout, atomic_dir, atomic_file
from storage.query import QueryResult, query, query_all
from storage.token_files import DamagedFileWarning, find_token_files
from storage.store import Store

__all__ = [
    "DamagedFileWarning",
    "QueryRefusedError",
    "QueryResult",
    "RunLayout",
    "Store",
    "StorageError",
    "WorkdirBusyError",
    "atomic_dir",
    "atomic_file",
    "find_token_files",
    "query",
    "query_all",
]
