"""The calibrate flow on the embedded model: what it stores agrees with what it measured.

Run: `python -m pytest tests/flows/test_calibrate.py -q` (about a minute: Prefect's test
API, 2 prompts x 2 samples, 4 budgets).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest

from sparrow.control.choose import monotone_fit
from sparrow.sparse.io import load_schedule_yaml

pytestmark = pytest.mark.slow

GRID = [2, 4, 6, 12]


@pytest.fixture(scope="module")
def calibrated(flow_environment, tmp_path_factory):
    flow_environment.start()
    from sparrow.flows.calibrate import calibrate_flow

    workdir = tmp_path_factory.mktemp("cal") / "work"
    overrides = [
        f"pipeline.workdir={workdir}",
        "calibrate.num_prompts=2",
        "calibrate.repeats=2",
        f"calibrate.topk_pages=[{','.join(map(str, GRID))}]",
        "calibrate.min_bin_tokens=20",
        "calibrate.min_bin_samples=1",
        "calibrate.max_new_tokens=200",
        "calibrate.name=tiny-cal",
    ]
    summary = calibrate_flow(overrides, calibration_id="cal-test")
    return workdir, summary


def test_the_chosen_schedule_meets_the_target_in_every_measured_bin(calibrated):
    workdir, summary = calibrated
    table = json.loads((workdir / "calibrations/cal-test/table.json").read_text())
    assert table["topk_pages"] == GRID
    chosen = summary["topk_pages"]
    assert chosen == sorted(chosen) and len(chosen) == 8  # tiny-0.86 has 8 bins
    measured = [i for i, n in enumerate(table["tokens"]) if n >= 20]
    assert measured
    # the choice reads the lower bound of p5, fitted non-decreasing in the budget
    lower = monotone_fit(np.array(table["p5_lo"], dtype=float))
    assert summary["chosen_by"] == "lower confidence bound"
    for i in measured:
        j = GRID.index(chosen[i])
        assert lower[j, i] >= summary["target"] or j == len(GRID) - 1
        assert table["p5_lo"][j][i] <= table["p5"][j][i] <= table["p5_hi"][j][i]
        # and no cheaper budget would have done, unless the schedule may not fall there
        cheaper = [b for b in GRID if b < chosen[i] and lower[GRID.index(b), i] >= 0.86]
        assert not cheaper or (i > 0 and chosen[i - 1] == chosen[i])
    thin = [i for i in range(8) if i not in measured]
    assert all(any(f"bin {i}:" in note for note in summary["notes"]) for i in thin)


def test_duckdb_yaml_and_mlflow_hold_the_same_schedule(calibrated):
    workdir, summary = calibrated
    schedule = load_schedule_yaml(summary["yaml"])
    assert schedule.name == "tiny-cal" and list(schedule.topk_pages) == summary["topk_pages"]
    assert schedule.page_size == 8 and schedule.bin_tokens == 64
    table = json.loads((workdir / "calibrations/cal-test/table.json").read_text())
    with duckdb.connect(str(workdir / "sparrow.duckdb"), read_only=True) as conn:
        row = conn.execute(
            "SELECT version, topk_pages, yaml_path, run_id FROM schedules WHERE name = 'tiny-cal'"
        ).fetchall()
        cal = conn.execute(
            "SELECT topk_pages, bin, n, p5, p1, p10 FROM calibration "
            "WHERE calibration_id = 'cal-test'"
        ).fetchall()
    assert row == [(1, summary["topk_pages"], summary["yaml"], "cal-test")]
    measured = [i for i, n in enumerate(table["tokens"]) if n]
    assert len(cal) == len(GRID) * len(measured)
    for budget, b, n, p5, p1, p10 in cal:
        assert n == table["tokens"][b]
        assert p5 == pytest.approx(table["p5"][GRID.index(budget)][b])
        assert (p1, p10) == pytest.approx(
            (table["p1"][GRID.index(budget)][b], table["p10"][GRID.index(budget)][b])
        )
        assert p1 <= p5 <= p10
    assert Path(summary["plot"]).read_bytes()[:4] == b"\x89PNG"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(summary["mlflow_run_id"], "calibration")}
    assert "calibration/calibration.png" in artifacts
    schedules = [a.path for a in client.list_artifacts(summary["mlflow_run_id"], "schedules")]
    assert schedules == ["schedules/tiny-cal-v1.yaml"]
    assert summary["calibration_s"] == pytest.approx(summary["sample_s"] + summary["replay_s"])
    assert np.isfinite(summary["calibration_s"]) and summary["calibration_s"] > 0
