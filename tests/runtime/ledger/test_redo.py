"""`sparrow runs redo`'s mechanism: a recorded stage and the ones after it in its step are
forgotten and their folders removed, so the next run_stage runs them again; an error about a
recorded stage's file names the command. No Prefect or Ray needed.

Run: `python -m pytest tests/runtime/ledger/test_redo.py -q`.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from sparrow.runtime.ledger.redo import RedoError, parse_stage_at, redo_stage
from sparrow.runtime.ledger.stage import StageInputError, StageWrite, run_stage
from sparrow.storage import RunLayout, Store, query
from sparrow.storage.errors import WorkdirBusyError


def _runtime(workdir):
    return SimpleNamespace(
        run_id="r",
        store=Store.open_writer(workdir),
        layout=RunLayout(workdir, "r"),
        fail_at=None,
        kill_at=None,
        stages_run=Counter(),
        tracker=None,
    )


def _write(text: str):
    def body(out):
        (out / "out.txt").write_text(text)
        return StageWrite(metrics={"m": 1.0})

    return body


def _recorded(workdir) -> list[tuple]:
    return query(workdir, "SELECT step, stage FROM stage_runs ORDER BY step, stage").rows


def test_redo_forgets_the_stage_and_the_later_ones_of_its_step(tmp_path):
    runtime = _runtime(tmp_path)
    for step, stage in [(1, "rollout"), (2, "rollout"), (2, "reward"), (2, "dense_score")]:
        run_stage(runtime, stage, step, _write(f"{stage}{step}"))
    with pytest.raises(WorkdirBusyError):  # never under a run that writes
        redo_stage(tmp_path, "r", "reward", 2)
    runtime.store.close()

    assert redo_stage(tmp_path, "r", "reward", 2) == ["reward", "dense_score"]
    assert _recorded(tmp_path) == [(1, "rollout"), (2, "rollout")]
    step2 = tmp_path / "runs" / "r" / "step-2"
    assert sorted(p.name for p in step2.iterdir()) == ["rollout"]
    with pytest.raises(RedoError, match="no recorded stage reward at step 2"):
        redo_stage(tmp_path, "r", "reward", 2)

    runtime = _runtime(tmp_path)
    again = run_stage(runtime, "reward", 2, _write("again"))
    assert not again.skipped and again.path("out.txt").read_text() == "again"
    runtime.store.close()


def test_a_damaged_recorded_file_names_the_redo_command(tmp_path):
    runtime = _runtime(tmp_path)
    rollout = run_stage(runtime, "rollout", 2, _write("x"))

    def reads_damaged(out):
        raise StageInputError(f"rollout file {rollout.path('out.txt')} is not readable")

    with pytest.raises(StageInputError) as caught:
        run_stage(runtime, "reward", 2, reads_damaged)
    assert f"`sparrow runs redo r rollout@2 --workdir {tmp_path}`" in str(caught.value)
    runtime.store.close()


@pytest.mark.parametrize("spec", ["rollout", "nope@2", "rollout@x", "rollout@0"])
def test_bad_specs_name_the_form(spec):
    with pytest.raises(RedoError, match="expected STAGE@STEP"):
        parse_stage_at(spec)
