"""The stage mechanism: skip when recorded, fail on purpose before writing, atomic output,
metrics replaced (never duplicated) on a re-run. No Prefect or Ray needed.

Run: `python -m pytest tests/runtime/ledger/test_stage.py -q`.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from sparrow.runtime.ledger.stage import (
    STAGES,
    StageFailedOnPurpose,
    StageWrite,
    parse_fail_at,
    run_stage,
)
from sparrow.storage import RunLayout, Store, query


class FakeTracker:
    def __init__(self):
        self.logged = []

    def log_step(self, step, metrics):
        self.logged.append((step, dict(metrics)))


@pytest.fixture
def runtime(tmp_path):
    store = Store.open_writer(tmp_path)
    yield SimpleNamespace(
        run_id="r",
        store=store,
        layout=RunLayout(tmp_path, "r"),
        fail_at=None,
        kill_at=None,
        stages_run=Counter(),
        tracker=FakeTracker(),
    )
    store.close()


def write_file(text: str, metrics: dict | None = None, **kwargs):
    def body(out):
        (out / "out.txt").write_text(text)
        return StageWrite(metrics=metrics or {}, **kwargs)

    return body


def test_first_run_writes_records_and_logs(runtime, tmp_path):
    seen = []
    outcome = run_stage(
        runtime, "reward", 3, write_file("a", {"reward/mean": 0.25}, after_commit=seen.append)
    )
    final = tmp_path / "runs" / "r" / "step-3" / "reward"
    assert (outcome.output_dir, outcome.skipped) == (str(final), False)
    assert outcome.path("out.txt").read_text() == "a" and seen == [final]
    [row] = query(tmp_path, "SELECT step, stage, output_dir, duration_s FROM stage_runs").rows
    assert row[:3] == (3, "reward", str(final)) and row[3] == pytest.approx(outcome.duration_s)
    metrics = dict(query(tmp_path, "SELECT name, value FROM step_metrics WHERE step = 3").rows)
    assert metrics["reward/mean"] == 0.25 and metrics["time/reward_s"] == pytest.approx(
        outcome.duration_s
    )
    assert runtime.tracker.logged == [(3, metrics)]
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".")]  # no scratch left


def test_recorded_stage_is_skipped_and_its_files_untouched(runtime):
    first = run_stage(runtime, "rollout", 1, write_file("first"))
    mtime = first.path("out.txt").stat().st_mtime_ns
    calls = []
    again = run_stage(runtime, "rollout", 1, lambda out: calls.append(out) or StageWrite())
    assert calls == [] and again.skipped and again.output_dir == first.output_dir
    assert again.path("out.txt").read_text() == "first"
    assert again.path("out.txt").stat().st_mtime_ns == mtime
    assert runtime.stages_run == Counter({"rollout": 1})


def test_fail_at_raises_before_writing(runtime, tmp_path):
    runtime.fail_at = parse_fail_at("dense_score@2")
    run_stage(runtime, "dense_score", 1, write_file("step 1 is not the step named"))
    with pytest.raises(StageFailedOnPurpose, match="dense_score failed on purpose at step 2"):
        run_stage(runtime, "dense_score", 2, write_file("never"))
    assert not (tmp_path / "runs" / "r" / "step-2").exists()
    assert query(tmp_path, "SELECT step FROM stage_runs").rows == [(1,)]


def test_failing_body_leaves_no_folder_and_no_row(runtime, tmp_path):
    def body(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        run_stage(runtime, "reward", 1, body)
    assert not (tmp_path / "runs" / "r" / "step-1" / "reward").exists()
    assert list((tmp_path / "runs" / "r" / "step-1").iterdir()) == []
    assert query(tmp_path, "SELECT count(*) FROM stage_runs").rows == [(0,)]
    # a failing db write rolls back the stage's row as well
    with pytest.raises(RuntimeError, match="no table"):
        run_stage(
            runtime,
            "reward",
            1,
            lambda out: StageWrite(db=lambda conn: (_ for _ in ()).throw(RuntimeError("no table"))),
        )
    assert query(tmp_path, "SELECT count(*) FROM stage_runs").rows == [(0,)]


def test_rerun_after_a_lost_record_replaces_rows(runtime, tmp_path):
    run_stage(runtime, "reward", 1, write_file("a", {"reward/mean": 0.5}))
    with runtime.store.connect() as conn:  # as if the process died before recording
        conn.execute("DELETE FROM stage_runs")
    run_stage(runtime, "reward", 1, write_file("b", {"reward/mean": 0.75}))
    assert query(tmp_path, "SELECT value FROM step_metrics WHERE name = 'reward/mean'").rows == [
        (0.75,)
    ]
    assert query(tmp_path, "SELECT count(*) FROM stage_runs").rows == [(1,)]
    assert (tmp_path / "runs/r/step-1/reward/out.txt").read_text() == "b"


def test_parse_fail_at():
    assert parse_fail_at("") is None
    assert parse_fail_at("policy_update@12") == ("policy_update", 12)
    with pytest.raises(StageFailedOnPurpose, match="'polcy_update@1' names no stage"):
        parse_fail_at("polcy_update@1")
    assert STAGES.index("rollout") < STAGES.index("dense_score") < STAGES.index("policy_update")
