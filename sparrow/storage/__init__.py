"""Storage: the DuckDB mismatch history and the on-disk artifact layout (no torch here).

    store = Store.open_writer(workdir)        # one writer per workdir, held for a run
    with store.connect() as conn:             # one transaction
        run_rows.replace_step_metrics(conn, run_id, step, {"reward/mean": 0.5})
    rows = query(workdir, "SELECT * FROM bin_stats WHERE p5 < 0.86")   # read-only

Every SQL statement of the project lives here, one module per group of tables, plain values
in and out: run_rows (runs, stage_runs, step_metrics), schedule_rows (schedules,
calibration), mismatch_rows (bin_stats, threshold_events), study_rows (study_arms and a
study's report), report_rows (a run's report), eval_rows (eval_results). Callers hold a
transaction, never SQL.
"""

from sparrow.storage.errors import QueryRefusedError, StorageError, WorkdirBusyError
from sparrow.storage.layout import RunLayout, atomic_dir, atomic_file
from sparrow.storage.query import QueryResult, query, query_all
from sparrow.storage.store import Store
from sparrow.storage.token_files import DamagedFileWarning, find_token_files

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
