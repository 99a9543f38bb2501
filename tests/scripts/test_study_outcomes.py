"""scripts/study_outcomes.py: seed folders to one figure of every unit's outcome and label, and
its CSV; a folder not named <variant>-s<seed> is one error.

Run: `python -m pytest tests/scripts/test_study_outcomes.py -q`.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "study_outcomes.py"), *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


def _seed(root: Path, seed: int, outcomes: dict[str, float]) -> Path:
    folder = root / f"v2-s{seed}"
    folder.mkdir(parents=True)
    arms = {
        arm: {"steps_done": 100, "outcome": {"accuracy": value},
              "gap_to_dense": value - outcomes["dense"]}
        for arm, value in outcomes.items()
    }  # fmt: skip
    (folder / "summary.json").write_text(json.dumps({"arms": arms, "start": {"accuracy": 0.3}}))
    for arm in outcomes:  # one in-run eval at step 50: the peak
        (folder / f"{arm}_steps.csv").write_text("step,eval/accuracy\n50,0.6\n")
    return folder


def test_every_unit_reaches_the_csv_with_its_label_and_the_figure_is_drawn(tmp_path):
    s0 = _seed(tmp_path, 0, {"dense": 0.9, "centroid-0.86": 0.88, "fixed": 0.1})
    s1 = _seed(tmp_path, 1, {"dense": 0.95, "centroid-0.86": 0.6, "fixed": 0.32})
    out = tmp_path / "img" / "outcomes.png"
    done = _run(s0, s1, "--out", out)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000
    with open(out.with_suffix(".csv"), newline="") as handle:
        rows = {(r["seed"], r["arm"]): r for r in csv.DictReader(handle)}
    assert len(rows) == 6
    # the pre-registered rule: stable within 0.05 of dense; below start - 0.05, or more than
    # 0.10 under a peak after step 30, destabilized; otherwise stalled
    assert rows[("0", "centroid-0.86")]["label"] == "stable"
    assert rows[("1", "centroid-0.86")]["label"] == "stalled"
    assert rows[("0", "fixed")]["label"] == "destabilized"
    assert rows[("1", "fixed")]["label"] == "destabilized"  # 0.32 < peak 0.6 - 0.10
    assert float(rows[("1", "centroid-0.86")]["gap"]) == -0.35


def test_a_folder_not_named_for_a_seed_is_one_error(tmp_path):
    folder = tmp_path / "holdA"
    folder.mkdir()
    done = _run(folder, "--out", tmp_path / "o.png")
    assert done.returncode != 0 and "holdA" in done.stderr and "<variant>-s<seed>" in done.stderr
    assert not (tmp_path / "o.png").exists()
