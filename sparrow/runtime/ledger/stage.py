"""The one mechanism every stage shares: skip if recorded, fail on purpose, write, record.

    outcome = run_stage(runtime, "reward", step, body)

`body(scratch: Path) -> StageWrite` writes the stage's files into a scratch folder; the
folder is renamed into `<workdir>/runs/<run_id>/step-<n>/<stage>/` when the body returns,
and then one DuckDB transaction records the `stage_runs` row together with the stage's step
metrics (`time/<stage>_s` included) and whatever rows the body asked to write (delete-then-
insert by key). Only after that commit are metrics and events sent to MLflow.

- A stage with a `stage_runs` row is not run again: its recorded folder is returned and its
  files are left untouched (this is how a flow resumes).
- `pipeline.fail_at=STAGE@STEP` raises StageFailedOnPurpose in that stage at that step, before
  it writes anything; `pipeline.kill_at=STAGE@STEP` kills the process (SIGKILL) after the
  stage wrote its files and before it is renamed and recorded (fault-injection tests).
- Retries (sparrow/runtime/retry.py) re-run a stage from its inputs; the rename and the delete-then-
  insert make that safe.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sparrow.errors import DiskFullError, SparrowError, disk_full_error, is_disk_full
from sparrow.runtime import interrupt
from sparrow.storage import atomic_dir
from sparrow.storage.run_rows import (
    record_stage,
    replace_step_metrics,
    stage_record,
    stage_records,
)

if TYPE_CHECKING:
    from sparrow.runtime.run_runtime import RunRuntime

# the stages of one RL step, in the order the train flow runs them (docs/architecture.md, "One RL step")
STAGES = (
    "rollout",
    "reward",
    "dense_score",
    "aggregate_mismatch",
    "reoptimize_schedule",
    "policy_update",
    "distill_lora",
    "sync_weights",
    "checkpoint",
    "evaluate",
)


class StageFailedOnPurpose(SparrowError):
    """pipeline.fail_at named this stage and step."""


class StageInputError(SparrowError):
    """A stage's input (a file an earlier stage wrote) is missing or disagrees with another."""


@dataclass(frozen=True)
class StageWrite:
    """What a stage body hands back besides its files.

    metrics: step metrics (name -> number) stored in step_metrics and sent to MLflow.
    db: writes more rows inside the transaction that records the stage.
    after_commit: called with the final folder once the stage is recorded (MLflow events,
    in-memory state).
    """

    metrics: Mapping[str, float] = field(default_factory=dict)
    db: Callable[[object], None] | None = None
    after_commit: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class StageOutcome:
    """A reference to a finished stage: what the Prefect task returns (never tensors)."""

    stage: str
    step: int
    output_dir: str
    skipped: bool
    duration_s: float

    def path(self, name: str) -> Path:
        return Path(self.output_dir) / name


def parse_fail_at(spec: str) -> tuple[str, int] | None:
    """ "policy_update@2" -> ("policy_update", 2); "" -> None. The config loader checked the form."""
    if not spec:
        return None
    stage, _, step = spec.partition("@")
    if stage not in STAGES:
        raise StageFailedOnPurpose(
            f"pipeline.fail_at={spec!r} names no stage; stages: {', '.join(STAGES)}"
        )
    return stage, int(step)


def run_stage(
    runtime: RunRuntime, stage: str, step: int, body: Callable[[Path], StageWrite]
) -> StageOutcome:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    interrupt.check()  # a Ctrl-C that landed where Python could not raise it
    run_id = runtime.run_id
    recorded = stage_record(runtime.store, run_id, step, stage)
    if recorded is not None:
        return StageOutcome(stage, step, recorded.output_dir, True, recorded.duration_s)
    if runtime.fail_at == (stage, step):
        raise StageFailedOnPurpose(
            f"stage {stage} failed on purpose at step {step} (pipeline.fail_at={stage}@{step}); "
            f"run again without pipeline.fail_at and the same pipeline.run_id={run_id} to resume"
        )
    started, clock = datetime.now(UTC).replace(tzinfo=None), time.perf_counter()
    final = runtime.layout.stage_dir(step, stage)
    runtime.stages_run[stage] += 1
    with atomic_dir(final) as scratch:
        written = _run_body(runtime, stage, step, body, scratch)
        if runtime.kill_at == (stage, step):
            # fault injection: the files are written, the folder not renamed, nothing recorded
            os.kill(os.getpid(), signal.SIGKILL)
    duration = time.perf_counter() - clock
    finished = datetime.now(UTC).replace(tzinfo=None)
    metrics = {**written.metrics, f"time/{stage}_s": duration}
    try:
        with runtime.store.connect() as conn:
            if written.db is not None:
                written.db(conn)
            replace_step_metrics(conn, run_id, step, metrics)
            record_stage(conn, run_id, step, stage, started, finished, duration, str(final))
    except Exception as err:
        if not is_disk_full(err, runtime.store.path):
            raise
        # the folder is in place but unrecorded: a resume writes it again
        raise disk_full_error(
            runtime.store.path, None, " (DuckDB grows its file and WAL)"
        ) from None
    if runtime.tracker is not None:
        runtime.tracker.log_step(step, metrics)
    if written.after_commit is not None:
        written.after_commit(final)
    return StageOutcome(stage, step, str(final), False, duration)


def _run_body(
    runtime: RunRuntime, stage: str, step: int, body: Callable[[Path], StageWrite], scratch: Path
) -> StageWrite:
    """The stage's body; its error about a recorded file names `sparrow runs redo`, and a
    full disk (torch, pyarrow, safetensors each say it their own way) is one DiskFullError."""
    try:
        return body(scratch)
    except DiskFullError:
        raise
    except SparrowError as err:
        _add_redo_hint(runtime, err)
        raise
    except Exception as err:
        if not is_disk_full(err, scratch):
            raise
        needed, note = _space_needed(runtime, stage, step, scratch)
        final = runtime.layout.stage_dir(step, stage)
        raise disk_full_error(final, needed, note) from None


def _space_needed(runtime: RunRuntime, stage: str, step: int, scratch: Path) -> tuple[int, str]:
    """What the stage's folder took at the newest earlier step, else what it wrote so far."""
    earlier = [
        r
        for r in stage_records(runtime.store, runtime.run_id)
        if r.stage == stage and r.step < step
    ]
    if earlier:
        folder = Path(earlier[-1].output_dir)
        size = folder_bytes(folder)
        if hasattr(runtime, "policy_state"):  # a background-saved policy lives beside it
            state = runtime.policy_state(folder, wait=False)
            size += folder_bytes(state) if state != folder else 0
        return size, f" (what {stage} wrote at step {earlier[-1].step})"
    return folder_bytes(scratch), " (at least: what it had written when the disk filled)"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _add_redo_hint(runtime: RunRuntime, err: SparrowError) -> None:
    """An error about a recorded stage's file names the way out (sparrow runs redo)."""
    from sparrow.runtime.ledger.redo import redo_hint

    message = str(err)
    hint = redo_hint(runtime.layout.run_dir, runtime.run_id, runtime.store.workdir, message)
    if hint and len(err.args) == 1:
        err.args = (message + hint,)
