"""A way out of a damaged recorded stage: forget it, and the stages after it in its step.

    forgotten = redo_stage("./sparrow-work", "run-...", "rollout", 2)   # sparrow runs redo
    hint = redo_hint(run_dir, run_id, workdir, message)                 # in a stage's error

A recorded stage is never run again (that is how a run resumes), so a recorded output that
became unreadable (a truncated rollouts.parquet, a file overwritten by hand) stops every
resume at the stage that reads it. redo_stage drops the stage's `stage_runs` row and those of
the stages after it in the same step (STAGES order), removes their folders, and marks the run
`interrupted`; the next `sparrow train pipeline.run_id=ID` runs them again from their inputs
(seeded, so they write what they wrote the first time). Later steps keep their records: their
inputs were the same outputs. The choice of an explicit command over the resume re-running
an unreadable stage on its own: only the stage that reads a file can tell it is damaged, and
a resume that silently recomputed recorded work would hide a disk or a user that damages it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from sparrow.errors import SparrowError
from sparrow.runtime.ledger.stage import STAGES
from sparrow.storage import Store
from sparrow.storage.run_rows import forget_stages, set_run_status, stage_records


class RedoError(SparrowError):
    """A redo that names no recorded stage."""


def parse_stage_at(spec: str) -> tuple[str, int]:
    """ "rollout@2" -> ("rollout", 2), with one error line naming the valid stages."""
    stage, sep, step = spec.partition("@")
    if not sep or stage not in STAGES or not step.isdigit() or int(step) < 1:
        raise RedoError(
            f"expected STAGE@STEP (e.g. rollout@2), got {spec!r}; stages: {', '.join(STAGES)}"
        )
    return stage, int(step)


def redo_stage(workdir: str | Path, run_id: str, stage: str, step: int) -> list[str]:
    """Forget `stage` at `step` and the recorded stages after it there; their names, in order.
    Takes the workdir's writer lock, so a run writing it is never changed under it."""
    store = Store.open_writer(workdir)
    try:
        recorded = {r.stage: r for r in stage_records(store, run_id) if r.step == step}
        if stage not in recorded:
            have = ", ".join(recorded) or "none"
            raise RedoError(
                f"run {run_id!r} has no recorded stage {stage} at step {step} "
                f"(recorded at step {step}: {have}; `sparrow runs {run_id}` lists them)"
            )
        forgotten = [name for name in STAGES[STAGES.index(stage) :] if name in recorded]
        forget_stages(store, run_id, step, forgotten)
        with store.connect() as conn:
            set_run_status(conn, run_id, "interrupted")
        for name in forgotten:
            _remove(Path(recorded[name].output_dir))
    finally:
        store.close()
    return forgotten


def _remove(folder: Path) -> None:
    # renamed first, so an interrupted removal leaves a scratch name the next writer clears
    if folder.is_dir():
        doomed = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(doomed, ignore_errors=True)
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def redo_hint(run_dir: Path, run_id: str, workdir: str | Path, message: str) -> str:
    """The remedy to add to an error about a file of a recorded stage's folder; "" if none."""
    found = re.search(re.escape(str(run_dir)) + r"/step-(\d+)/([a-z_]+)/", message)
    if found is None or found.group(2) not in STAGES:
        return ""
    at = f"{found.group(2)}@{found.group(1)}"
    return (
        f"; if that recorded output is damaged, `sparrow runs redo {run_id} {at} --workdir "
        f"{workdir}` forgets it and the stages after it in step {found.group(1)}, and the "
        f"same `sparrow train` runs them again"
    )
