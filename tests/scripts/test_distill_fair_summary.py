"""scripts/distill_fair_summary.py on hand-made benchmark reports: the summary, and with --plot
the figure and its per-step CSV (the numbers docs/distill.md's figure is drawn from)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "distill_fair_summary.py"


def _report(path: Path, seed: int, steps: int = 3, **step_extra) -> Path:
    rows = [
        {"step": s + 1, "tokens": 100 - s, "p5_lora": 0.9 + s / 100, "p5_base": 0.95,
         "min_bin_p5_lora": 0.8, "min_bin_p5_base": 0.85, **step_extra}
        for s in range(steps)
    ]  # fmt: skip
    fixed = {
        "prompts": 4,
        "tokens": 400,
        "after_lora": {"p5": 0.93 - seed / 100},
        "after_base": {"p5": 0.97},
        "lora_minus_base_after": {"p5": {"delta": -0.04, "low": -0.05, "high": -0.03}},
    }
    path.write_text(json.dumps({"args": {"seed": seed}, "steps": rows, "fixed_set": fixed}))
    return path


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plot_writes_the_figure_and_every_step_of_every_seed_in_seed_order(tmp_path):
    reports = [_report(tmp_path / f"s{s}.json", s, reward_mean=0.5) for s in (2, 0, 1)]
    plot = tmp_path / "fair.png"
    done = _run(*reports, "--out", tmp_path / "summary.json", "--plot", plot)
    assert done.returncode == 0, done.stdout + done.stderr
    assert plot.stat().st_size > 10_000
    with open(f"{plot}.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["seed"], r["step"]) for r in rows] == [
        (str(s), str(t)) for s in (0, 1, 2) for t in (1, 2, 3)
    ]
    assert (
        rows[1]["p5_lora"] == "0.91"
        and rows[1]["tokens"] == "99"
        and rows[0]["reward_mean"] == "0.5"
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdict"]["lora_helps"] == "refuted"  # every interval below 0


def test_reports_without_step_rows_are_one_line_for_the_plot(tmp_path):
    report = _report(tmp_path / "s0.json", 0)
    data = json.loads(report.read_text())
    for row in data["steps"]:
        del row["p5_base"]
    report.write_text(json.dumps(data))
    done = _run(report, "--out", tmp_path / "summary.json", "--plot", tmp_path / "f.png")
    assert done.returncode == 2 and "--plot: a report's steps lack 'p5_base'" in done.stdout
    assert (tmp_path / "summary.json").is_file()  # the summary was written before the plot
    assert not (tmp_path / "f.png").exists() and not (tmp_path / "f.png.csv").exists()
