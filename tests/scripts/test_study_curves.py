"""scripts/study_curves.py: a seed folder's per-step CSVs to one figure and its CSV; a folder
without them is one error.

Run: `python -m pytest tests/scripts/test_study_curves.py -q`.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "step,eval/accuracy,reward/mean,schedule/pages_read_mean,mismatch/min_p5,other\n"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "study_curves.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_every_arm_and_step_reaches_the_csv_and_the_figure_is_drawn(tmp_path):
    seed = tmp_path / "v2-s0"
    seed.mkdir()
    (seed / "dense_steps.csv").write_text(
        HEADER + "0,,,,,1\n1,,0.3,257.5,0.99,2\n2,0.5,0.4,257.7,0.98,3\n"
    )
    (seed / "fixed_steps.csv").write_text(HEADER + "1,,0.0,5.1,0.02,4\n")
    out = tmp_path / "img" / "curves.png"
    done = _run(seed, "--out", out)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000
    with open(out.with_suffix(".csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["arm"], r["step"]) for r in rows] == [("dense", "1"), ("dense", "2"), ("fixed", "1")]
    assert rows[0]["eval/accuracy"] == "" and rows[1]["eval/accuracy"] == "0.5"
    assert rows[2]["schedule/pages_read_mean"] == "5.1" and "other" not in rows[0]


def test_a_folder_without_step_csvs_is_one_error(tmp_path):
    done = _run(tmp_path, "--out", tmp_path / "c.png")
    assert done.returncode != 0
    assert "no <arm>_steps.csv" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "c.png").exists()
