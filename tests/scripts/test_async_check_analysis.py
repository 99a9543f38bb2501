"""scripts/async_check_analysis.py on hand-made one-step-off holds, with hold 1 of the
stability study's seed 0 (kept in benchmarks/results) as the dense partner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import async_check_analysis  # noqa: E402

HOLD1 = ROOT / "benchmarks/results/h200-2026-11-29/v2-s0-hold1/v2-s0"


def _hold(root: Path, seed: int, outcomes: dict[str, float], steps: int = 100) -> Path:
    folder = root / f"v2_async-s{seed}"
    folder.mkdir(parents=True)
    arms = {a: {"steps_done": steps, "outcome": {"accuracy": v}} for a, v in outcomes.items()}
    summary = {"arms": arms, "start": {"accuracy": 0.342}}
    (folder / "summary.json").write_text(json.dumps(summary))
    for arm, value in outcomes.items():
        rows = ["step,eval/accuracy"] + [f"{s},{value * s / 100:.4f}" for s in range(10, 101, 10)]
        (folder / f"{arm}_steps.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_pairs_come_from_the_hold_and_the_study_and_one_seed_is_inconclusive(tmp_path):
    hold = _hold(tmp_path, 0, {"centroid-0.86": 0.979, "async-0.86": 0.970, "async-dense": 0.99})
    result = async_check_analysis.analyse([hold], [HOLD1])
    rows = {r["arm"]: r for r in result["rows"]}
    assert rows["async-0.86"]["gap"] == pytest.approx(0.970 - 0.979)
    # the study's dense of seed 0: 0.9833984375 (hold 1's summary.json)
    assert rows["async-dense"]["partner_outcome"] == pytest.approx(0.9833984375)
    assert rows["async-dense"]["label"] == "stable"  # within 0.05 of the study's dense
    assert result["pairs"]["async-0.86"]["verdict"] == "inconclusive"  # one seed
    assert result["verdict"] == "inconclusive"


def test_three_close_seeds_track_and_a_fallen_unit_refutes(tmp_path):
    holds = [
        _hold(tmp_path, s, {"centroid-0.86": 0.95, "async-0.86": 0.95 + d, "async-dense": 0.96})
        for s, d in ((0, 0.01), (1, -0.01), (2, 0.0))
    ]
    studies = [
        _hold(tmp_path / "study", s, {"dense": 0.96 + d})
        for s, d in ((0, 0.0), (1, 0.01), (2, -0.01))
    ]
    result = async_check_analysis.analyse(holds, studies)
    assert result["verdict"] == "tracks", result["pairs"]
    fallen = _hold(tmp_path / "fallen", 3, {"centroid-0.86": 0.95, "async-0.86": 0.2})
    result = async_check_analysis.analyse([*holds, fallen], studies)
    assert result["destabilized"] == ["async-0.86 seed 3"] and result["verdict"] == "refuted"
    assert "**Verdict: refuted.**" in async_check_analysis.markdown(result)


def test_a_folder_without_a_summary_is_one_error_that_names_it(tmp_path):
    (tmp_path / "v2_async-s0").mkdir()
    with pytest.raises(SystemExit, match="v2_async-s0"):
        async_check_analysis.analyse([tmp_path / "v2_async-s0"], [])
