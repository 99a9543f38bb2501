"""scripts/study_early_steps.py: per seed and arm, the means of the sparse actor's reward,
pages read and worst-bin p5 over the first steps; a bad folder or range is one error.

Run: `python -m pytest tests/scripts/test_study_early_steps.py -q`.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "study_early_steps.py"), *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip


def _seed(root: Path) -> Path:
    folder = root / "v2-s1"
    folder.mkdir()
    header = "step,reward/mean,schedule/pages_read_mean,mismatch/min_p5,eval/accuracy\n"
    # step 0 is the start's eval row: no reward, and outside any range from 1
    rows = ["0,,,,0.3"] + [f"{s},{0.1 * s},{100 + s},0.9,"
                           for s in range(1, 11)]  # fmt: skip
    (folder / "centroid-0.86_steps.csv").write_text(header + "\n".join(rows) + "\n")
    (folder / "dense_steps.csv").write_text(header + "1,0.5,258,0.99,\n2,0.7,258,0.99,\n")
    return folder


def test_means_over_the_first_steps_per_arm(tmp_path):
    out = tmp_path / "early.csv"
    done = _run(_seed(tmp_path), "--steps", "2-4", "--out", out)
    assert done.returncode == 0, done.stderr
    with open(out, newline="") as handle:
        rows = {r["arm"]: r for r in csv.DictReader(handle)}
    sparse = rows["centroid-0.86"]
    assert (sparse["variant"], sparse["seed"], sparse["steps"]) == ("v2", "1", "3")
    assert float(sparse["reward"]) == 0.3 and float(sparse["pages_read"]) == 103.0
    assert float(sparse["worst_bin_p5"]) == 0.9
    assert rows["dense"]["steps"] == "1" and float(rows["dense"]["reward"]) == 0.7


def test_a_bad_folder_or_range_is_one_error(tmp_path):
    folder = _seed(tmp_path)
    empty = _run(folder, "--steps", "50-60", "--out", tmp_path / "x.csv")
    assert empty.returncode == 1 and "no step in 50-60" in empty.stderr
    backwards = _run(folder, "--steps", "5-1", "--out", tmp_path / "x.csv")
    assert backwards.returncode == 2 and "FIRST <= LAST" in backwards.stderr
    (tmp_path / "hold2").mkdir()
    named = _run(tmp_path / "hold2", "--out", tmp_path / "x.csv")
    assert named.returncode == 1 and "expected a folder named <variant>-s<seed>" in named.stderr
    assert not (tmp_path / "x.csv").exists()
