"""The stage and metric rows of the train flow, under the names its modules import.

    recorded = stage_record(store, run_id, step, "reward")      # None until the stage finished
    with store.connect() as conn:
        record_stage(conn, run_id, step, "reward", started, finished, duration_s, output_dir)
        replace_step_metrics(conn, run_id, step, {"reward/mean": 0.5})

The SQL lives in storage/run_rows.py; this module only names it for tasks/stage.py,
tasks/runtime.py and the rest of tasks/ (new code may import storage.run_rows directly).
"""

from __future__ import annotations

from storage.run_rows import (
    StageRecord,
    forget_stages,
    record_stage,
    replace_step_metrics,
    stage_record,
    stage_records,
    step_metrics,
)

__all__ = ["StageRecord", "forget_stages", "record_stage", "replace_step_metrics",
           "stage_record", "stage_records", "step_metrics"]
