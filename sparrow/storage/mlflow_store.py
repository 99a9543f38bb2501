"""The one statement Sparrow runs on MLflow's own SQLite store (sparrow/runtime/tracking.py
makes a new local store as a copy of an empty one; MLflow itself does everything else):

    restamp_default_experiment(Path("w/mlflow.db"), "/home/me/mlruns/0", now_ms)
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path


def restamp_default_experiment(store: Path, artifact_location: str, now_ms: int) -> None:
    """Set the "Default" experiment's (id 0) artifact location and creation and update times,
    the fields MLflow fills from the process and the clock when it makes a store."""
    with closing(sqlite3.connect(store)) as conn, conn:
        conn.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
            "last_update_time = ? WHERE experiment_id = 0",
            (artifact_location, now_ms, now_ms),
        )
