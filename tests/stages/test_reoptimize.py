"""reoptimize_schedule: a crossing raises the bin, margin on the timer lowers it, each change
is a new schedule version in DuckDB (the one the next step's rollout takes) and an MLflow event.

The p5 history is written into bin_stats by hand; the re-measurement is real (the embedded
model, teacher-forced on two trajectories) and checked against percentiles computed here.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest
import torch

from sparrow.config import load_config
from sparrow.control.calibration import Trajectory, flat_schedule, schedule_acceptance
from sparrow.data.datasets import load_prompts
from sparrow.data.rollouts import RolloutRecord, write_rollouts
from sparrow.engine import Engine, EngineConfig, SamplingParams
from sparrow.model import load_model, load_tokenizer
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.ledger.contract import DECISION
from sparrow.runtime.ledger.schedules import insert_schedule, schedule_in_force
from sparrow.runtime.ledger.stage import run_stage
from sparrow.sparse.schedule import Schedule
from sparrow.stages.reoptimize_schedule import longest, reoptimize
from sparrow.storage import RunLayout, Store

pytestmark = pytest.mark.slow

GRID = [4, 12, 28]
RUN = "r1"


class FakeTracker:
    def __init__(self):
        self.schedules, self.tags, self.steps = [], {}, []
        self.mlflow_run_id = "m1"
        self.client = SimpleNamespace(
            set_tag=lambda run, key, value: self.tags.__setitem__(key, value)
        )

    def log_schedule(self, schedule, version, step):
        self.schedules.append((schedule.topk_pages, version, step))

    def log_step(self, step, metrics):
        self.steps.append((step, dict(metrics)))


@pytest.fixture(scope="module")
def sampled():
    torch.manual_seed(0)
    path = resolve_model_path("builtin:tiny")
    model, tokenizer = load_model(path), load_tokenizer(path)
    data = load_prompts("builtin:synthetic", "prompt", "answer", tokenizer, 1024)
    rows = [data.row(i) for i in range(2)]
    engine = Engine(model, tokenizer, EngineConfig(page_size=8, num_pages=256))
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=120, n=2, seed=7 + i) for i in range(2)
    ]
    results = engine.generate([list(r.prompt_ids) for r in rows], params)
    records = [
        RolloutRecord(
            p,
            s.sample_index,
            row.row,
            tuple(row.prompt_ids),
            s.output_ids,
            s.logprobs,
            s.topk_ids,
            s.topk_logprobs,
            s.pages_read,
            s.finish_reason,
            row.answer,
        )
        for p, (row, samples) in enumerate(zip(rows, results))
        for s in samples
    ]
    return model, path, records


def make_runtime(tmp_path: Path, sampled, topk, *overrides):
    model, path, records = sampled
    cfg = load_config(
        [
            f"pipeline.workdir={tmp_path}",
            "schedule.name=tiny-ctl",
            f"calibrate.topk_pages=[{','.join(map(str, GRID))}]",
            *overrides,
        ]
    )
    store = Store.open_writer(tmp_path)
    schedule = Schedule("tiny-ctl", topk, page_size=8, bin_tokens=64, skip_layers=(0,))
    with store.connect() as conn:
        insert_schedule(conn, schedule, 1, RUN, 0, "initial")
    layout = RunLayout(tmp_path, RUN)
    for step in (1, 2):
        write_rollouts(layout.stage_dir(step, "rollout") / "rollouts.parquet", records)
    runtime = SimpleNamespace(
        cfg=cfg,
        run_id=RUN,
        store=store,
        layout=layout,
        fail_at=None,
        kill_at=None,
        stages_run=Counter(),
        tracker=FakeTracker(),
        schedule_name="tiny-ctl",
        schedule_start_version=1,
        policy_folder_before=lambda step: path,
    )
    return runtime, schedule


def expected_topk(model, records, schedule, bin_, topk_pages, target=0.86):
    """Smallest budget whose exact p5 in the bin meets the target, computed bin by bin here."""
    trajectories = [Trajectory(r.prompt_ids + r.output_ids, len(r.prompt_ids)) for r in records]
    for budget in topk_pages:
        positions, alpha = schedule_acceptance(model, trajectories, flat_schedule(schedule, budget))
        in_bin = np.minimum(positions // 64, schedule.num_bins - 1) == bin_
        if np.percentile(alpha[in_bin], 5) >= target:
            return budget
    return None


def run(runtime, step):
    return run_stage(
        runtime, "reoptimize_schedule", step, lambda out: reoptimize(runtime, step, out)
    )


def test_a_crossing_raises_the_bin_as_a_new_version(tmp_path, sampled, set_p5):
    runtime, schedule = make_runtime(tmp_path, sampled, (2, 2, 2, 2, 2, 2, 2, 2))
    set_p5(runtime, 1, {2: 0.99, 3: 0.10})
    try:
        outcome = run(runtime, 1)
        decision = json.loads(Path(outcome.output_dir, DECISION.name).read_text())
        new, version = schedule_in_force(runtime.store, RUN, "tiny-ctl", 1, step=2)
    finally:
        runtime.store.close()
    want = expected_topk(sampled[0], sampled[2], schedule, 3, [4, 12, 28]) or 28
    assert decision["decision"]["raise_bins"] == [3]
    assert version == 2 and new.topk_pages == (2, 2, 2, want, want, want, want, want)
    assert runtime.tracker.schedules == [(new.topk_pages, 2, 1)]
    assert f"bin 3 raise 2->{want}" in runtime.tracker.tags["schedule.change.step1"]
    with duckdb.connect(str(tmp_path / "sparrow.duckdb"), read_only=True) as conn:
        row = conn.execute(
            "SELECT step, reason, yaml_path FROM schedules WHERE version = 2"
        ).fetchone()
    assert row[0] == 1 and "raise" in row[1] and Path(row[2]).is_file()


def test_margin_on_the_timer_lowers_and_nothing_happens_off_the_timer(tmp_path, sampled, set_p5):
    runtime, schedule = make_runtime(tmp_path, sampled, (28,) * 8, "pipeline.reoptimize_every=2")
    set_p5(runtime, 1, {2: 1.0, 3: 1.0})
    set_p5(runtime, 2, {2: 1.0, 3: 1.0})
    try:
        first = json.loads(Path(run(runtime, 1).output_dir, DECISION.name).read_text())
        assert first["changes"] == [] and first["decision"]["lower_bins"] == []
        run(runtime, 2)
        new, version = schedule_in_force(runtime.store, RUN, "tiny-ctl", 1, step=3)
    finally:
        runtime.store.close()
    model, _, records = sampled
    want2 = expected_topk(model, records, schedule, 2, [4, 12]) or 28
    want3 = max(want2, expected_topk(model, records, schedule, 3, [4, 12]) or 28)
    assert want3 < 28  # the near-dense 28 pages leave room to lower on this model
    assert version == 2 and new.topk_pages[2:4] == (want2, want3)
    # bins 0 and 1 hold only prompt tokens: they follow bin 2 down; bins 4.. keep 28
    assert new.topk_pages[:2] == (want2, want2) and new.topk_pages[4:] == (28,) * 4
    assert "schedule.change.step2" in runtime.tracker.tags


def test_remeasure_samples_keeps_the_longest_in_rollout_order():
    trajectories = [Trajectory((1,) * n, 1) for n in (5, 9, 3, 9, 7)]
    picked = longest(trajectories, 3)
    assert [len(t.ids) for t in picked] == [9, 9, 7]
    assert picked[0] is trajectories[1] and picked[1] is trajectories[3]
    assert longest(trajectories, 0) == trajectories == longest(trajectories, 9)
    with pytest.raises(ValueError, match="remeasure_samples"):
        longest(trajectories, -1)


def test_a_raise_replays_the_capped_trajectories_at_the_budgets_the_search_needs(
    tmp_path, sampled, set_p5
):
    runtime, schedule = make_runtime(tmp_path, sampled, (2,) * 8, "control.remeasure_samples=2")
    set_p5(runtime, 1, {3: 0.10})
    try:
        outcome = run(runtime, 1)
        decision = json.loads(Path(outcome.output_dir, DECISION.name).read_text())
    finally:
        runtime.store.close()
    model, _, records = sampled
    kept = sorted(records, key=lambda r: -len(r.output_ids) - len(r.prompt_ids))[:2]
    want = expected_topk(model, kept, schedule, 3, GRID) or GRID[-1]
    assert decision["trajectories_replayed"] == 2 and decision["topk_pages"][3] == want
    # the current 2 pages first (the raise confirmed there), then galloping from the next
    # notch: 4 alone when it meets, else 28 and perhaps 12
    measured = decision["topk_measured"]
    assert measured == [2] + (
        [4]
        if want == 4
        else [4, 12, 28]
        if want == 12
        else [b for b in GRID if b != 12 or b in measured]
    )
    [metrics] = [m for s, m in runtime.tracker.steps if s == 1]
    assert metrics["reoptimize/trajectories_replayed"] == 2.0
    assert metrics["reoptimize/topk_measured"] == len(measured)


def test_a_bin_below_target_at_the_grids_largest_budget_is_an_event_once(tmp_path, sampled, set_p5):
    """Nothing above 28 pages in the grid: the bin cannot be raised; the first such step
    records a grid_top event and an MLflow tag, every such step counts it. (On the trigger
    alone: at 28 pages this model meets the target exactly, so a confirmed raise drops it.)"""
    runtime, schedule = make_runtime(
        tmp_path, sampled, (2, 2, 2, 28, 28, 28, 28, 28), "control.confirm_raise=false"
    )
    set_p5(runtime, 1, {2: 0.99, 3: 0.10})
    set_p5(runtime, 2, {2: 0.99, 3: 0.12})
    try:
        first, second = (run(runtime, step) for step in (1, 2))
        decisions = [
            json.loads(Path(o.output_dir, DECISION.name).read_text()) for o in (first, second)
        ]
        _, version = schedule_in_force(runtime.store, RUN, "tiny-ctl", 1, step=3)
    finally:
        runtime.store.close()
    assert [d["at_grid_top"] for d in decisions] == [[3], [3]]
    assert all(d["changes"] == [] for d in decisions) and version == 1
    with duckdb.connect(str(tmp_path / "sparrow.duckdb"), read_only=True) as conn:
        events = conn.execute(
            "SELECT step, bin, kind, p5, target FROM threshold_events WHERE kind = 'grid_top'"
        ).fetchall()
        counted = conn.execute(
            "SELECT step, value FROM step_metrics WHERE "
            "name = 'reoptimize/bins_at_grid_top' ORDER BY step"
        ).fetchall()
    assert events == [(1, 3, "grid_top", pytest.approx(0.10), pytest.approx(0.86))]
    assert counted == [(1, 1.0), (2, 1.0)]
    assert "28 pages" in runtime.tracker.tags["schedule.grid_top.bin3"]
    assert "schedule.grid_top.bin2" not in runtime.tracker.tags


def test_a_trigger_the_exact_value_at_the_current_budget_does_not_confirm_raises_nothing(
    tmp_path, sampled, set_p5
):
    """The history reads p5 0.10 (as the top-k lower bound reads a broad distribution) where
    the exact p5 at the bin's current 28 pages meets the target: the raise is dropped, one
    replay at 28 pages says why, and no grid_top event; with confirm_raise=false the same step
    raises (the test above)."""
    model, _, records = sampled
    runtime, schedule = make_runtime(tmp_path, sampled, (2, 2, 2, 28, 28, 28, 28, 28))
    set_p5(runtime, 1, {2: 0.99, 3: 0.10})
    try:
        decision = json.loads(Path(run(runtime, 1).output_dir, DECISION.name).read_text())
        _, version = schedule_in_force(runtime.store, RUN, "tiny-ctl", 1, step=2)
        with duckdb.connect(str(tmp_path / "sparrow.duckdb"), read_only=True) as conn:
            events = conn.execute("SELECT count(*) FROM threshold_events").fetchone()[0]
    finally:
        runtime.store.close()
    exact = expected_topk(model, records, schedule, 3, [28])
    assert exact == 28  # the premise: 28 pages meet the target exactly in bin 3
    assert decision["decision"]["raise_bins"] == [] and decision["changes"] == []
    assert decision["topk_measured"] == [28] and decision["at_grid_top"] == []
    assert any("bin 3: exact" in r and "no raise" in r for r in decision["decision"]["reasons"])
    assert version == 1 and events == 0
    [metrics] = [m for s, m in runtime.tracker.steps if s == 1]
    assert metrics["reoptimize/raises_unconfirmed"] == 1.0
    assert metrics["reoptimize/raised"] == 0.0
