"""scripts/study_early_warning.py: every sparse arm of the folders given is a unit; the table
and JSON name the collapses and each signal's AUC; a fixed threshold is scored; a bad folder,
an arm read twice or an unknown signal is one error.

Run: `python -m pytest tests/scripts/test_study_early_warning.py -q`.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "step,reward/mean,actor/approx_kl,mismatch/min_p5\n"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "study_early_warning.py"), *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


def _arm(folder: Path, arm: str, collapse_at: int | None) -> None:
    lines = []
    for step in range(1, 61):
        reward = 0.05 if step == collapse_at else 0.6
        warns = collapse_at is not None and collapse_at - 3 <= step < collapse_at
        lines.append(f"{step},{reward},{1e-5 if warns else 1e-6},0.1")
    (folder / f"{arm}_steps.csv").write_text(HEADER + "\n".join(lines) + "\n")


def _seed(root: Path, name: str = "v3-s1") -> Path:
    folder = root / name
    folder.mkdir()
    _arm(folder, "centroid-0.86", 30)
    _arm(folder, "rule-0.80", None)
    _arm(folder, "dense", None)  # not a unit
    return folder


def test_units_collapses_and_a_fixed_threshold(tmp_path):
    out = tmp_path / "out"
    done = _run(_seed(tmp_path), "--out", out, "--fixed", "approx_kl=5e-6", "--resamples", "50")
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "early_warning.json").read_text())
    assert {u["unit"]: u["collapses"] for u in result["units"]} == {
        "v3-s1/centroid-0.86": [30],
        "v3-s1/rule-0.80": [],
    }
    by_signal = {row["signal"]: row for row in result["signals"]}
    assert by_signal["approx_kl"]["auc"] > 0.75
    assert by_signal["p5_worst_bin"]["auc"] == 0.5  # flat: every step tied
    assert result["fixed"] == [
        {"signal": "approx_kl", "threshold": 5e-6, "collapses": 1, "warned": 1,
         "quiet_steps": by_signal["approx_kl"]["steps"] - 5, "false_alarms": 0,
         "false_alarm_share": 0.0}
    ]  # fmt: skip
    table = (out / "early_warning.md").read_text()
    assert "| v3-s1/centroid-0.86 | 30 |" in table and "approx_kl >= 5e-06: 1 of 1" in table


def test_bad_inputs_are_one_error_each(tmp_path):
    seed = _seed(tmp_path)
    again = _run(seed, seed, "--out", tmp_path / "o")
    assert again.returncode != 0 and "already read" in again.stderr
    unknown = _run(seed, "--out", tmp_path / "o", "--fixed", "p99=1")
    assert unknown.returncode != 0 and "no signal 'p99'" in unknown.stderr
    empty = tmp_path / "v3-s2"
    empty.mkdir()
    missing = _run(empty, "--out", tmp_path / "o")
    assert missing.returncode != 0 and "no <arm>_steps.csv" in missing.stderr
    assert not (tmp_path / "o").exists()  # nothing written on an error


def test_the_figure_and_its_numbers(tmp_path):
    png = tmp_path / "warning.png"
    done = _run(_seed(tmp_path), "--out", tmp_path / "out", "--figure", png, "--resamples", "10")
    assert done.returncode == 0, done.stderr
    assert png.stat().st_size > 0
    with open(png.with_suffix(".csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 60  # two sparse units, steps 1-60; dense is not one
    flagged = [(r["unit"], r["step"]) for r in rows if r["collapse"] == "1"]
    assert flagged == [("v3-s1/centroid-0.86", "30")]
