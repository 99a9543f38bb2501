"""scripts/distill_fair.sh with stand-ins for `sparrow` (writes the calibrated schedules) and
for the benchmark (records its arguments, writes a report with a fixed set): the calibrations
through scripts/study_seed.sh, the runs on the study's task and length, and the summary it
leaves; no GPU, no run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "distill_fair.sh"

# top-k per bin by target, as seed 0's grid gave them: 0.75 no cheaper than 0.86 (CHEAP_AT: the
# first target whose schedule is cheaper)
FAKE_SPARROW = """#!/usr/bin/env bash
echo "sparrow $*" >> "$CALLS"
for a in "$@"; do case $a in calibrate.name=*) name=${a#*=};; pipeline.workdir=*) w=${a#*=};;
  schedule.target=*) t=${a#*=};; esac; done
[ -n "${NO_SCHEDULE:-}" ] && exit 0
top="[128, 128]"
awk -v t="$t" -v c="${CHEAP_AT:-0.70}" 'BEGIN { exit !(t <= c) }' && top="[112, 128]"
mkdir -p "$w/schedules" && printf "name: %s\ntopk_pages: %s\n" "$name" "$top" > "$w/schedules/$name-v1.yaml"
"""
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = benchmarks/distill.py ]; then
  echo "distill $*" >> "$CALLS"
  while [ $# -gt 0 ]; do case $1 in --seed) seed=$2;; --out) out=$2;; esac; shift; done
  p=0.8$((5 + seed))
  cat > "$out" <<JSON
{"args": {"seed": $seed}, "steps": [{"step": 1, "p5_lora": 0.8, "p5_base": 0.8}],
 "fixed_set": {"prompts": 16, "tokens": 100, "after_lora": {"p5": $p}, "after_base": {"p5": 0.79},
   "lora_minus_base_after": {"p5": {"delta": 0.02, "low": 0.01, "high": 0.03}}}}
JSON
else
  exec "$REAL_PYTHON" "$@"
fi
"""


def _run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sparrow", FAKE_SPARROW), ("fake-python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "model").mkdir()
    env = os.environ | {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "fake-python"),
        "REAL_PYTHON": sys.executable,
        "CALLS": str(tmp_path / "calls.txt"),
        "MODEL": str(tmp_path / "model"),
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        **extra,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_calibrates_both_targets_then_runs_each_seed_on_those_schedules(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    calibrations = [c for c in calls if c.startswith("sparrow calibrate")]
    targets = sorted(c.split("schedule.target=")[1].split()[0] for c in calibrations)
    assert targets == ["0.50", "0.60", "0.70", "0.75", "0.86"]
    assert all("model=testbed" in c and "data=testbed" in c for c in calibrations)
    grid = "calibrate.topk_pages=[2,4,8,12,16,24,32,48,64,80,96,104,112,120,128,192]"
    assert all(grid in c for c in calibrations)
    assert not any(" study run " in c for c in calls)  # CALIBRATE_ONLY: no arm runs
    runs = [c for c in calls if c.startswith("distill")]
    assert [r.split("--seed ")[1].split()[0] for r in runs] == ["0", "1", "2"]
    task = "builtin:multi_chase:num_defs=256,num_hops=63,chains=4,tags=0"  # study_v2.yaml's
    assert all(f"--data {task} " in r and "--max-new-tokens 2304 " in r for r in runs)
    work = tmp_path / "work" / "schedules"
    for r in runs:
        assert f"--calibrated {work}/v2-centroid-0.86-v1.yaml" in r
        # 0.75 gave 0.86's schedule: the first cheaper fallback is the test's
        assert f"--cheaper {work}/v2-centroid-0.70-v1.yaml" in r
        assert "--no-update" in r and "--steps 40" in r and "--fixed-samples 4" in r
        assert "--selector-coef 0 " in r  # the fair test: the LoRA's token loss alone
    summary = json.loads((tmp_path / "out" / "distill-fair" / "summary.json").read_text())
    assert summary["verdict"]["lora_helps"] == "helps"
    assert (tmp_path / "out" / "distill-fair" / "distill_fair.png.csv").read_text().count("\n") == 4
    assert summary["verdict"]["reached_target"] == [1, 2]  # p5 0.85, 0.86, 0.87 against 0.86


def test_the_cheaper_target_is_0_75_when_its_schedule_is_cheaper(tmp_path):
    done = _run(tmp_path, CHEAP_AT="0.75", SEEDS="0")
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = json.loads((tmp_path / "out" / "distill-fair" / "cheaper.json").read_text())
    assert chosen["target"] == 0.75 and chosen["cheaper"].endswith("v2-centroid-0.75-v1.yaml")


def test_the_selector_run_passes_its_coefficient_and_writes_apart(tmp_path):
    done = _run(tmp_path, SELECTOR="1.0", SEEDS="0")
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [c for c in (tmp_path / "calls.txt").read_text().splitlines() if c.startswith("distill")]
    assert len(runs) == 1 and "--selector-coef 1.0 " in runs[0]
    assert (tmp_path / "out" / "distill-fair-selector" / "summary.json").is_file()
    assert not (tmp_path / "out" / "distill-fair").exists()


def test_no_cheaper_schedule_stops_before_any_run(tmp_path):
    done = _run(tmp_path, CHEAP_AT="0.10")
    assert done.returncode == 3
    assert "no target of 0.75 0.70 0.60 0.50 calibrated to a schedule cheaper" in done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert not any(c.startswith("distill") for c in calls)


def test_a_calibration_without_a_schedule_is_one_error_before_any_run(tmp_path):
    done = _run(tmp_path, NO_SCHEDULE="1")
    assert done.returncode != 0
    assert "calibration at 0.86 wrote no schedule" in done.stderr
    assert not any(
        c.startswith("distill") for c in (tmp_path / "calls.txt").read_text().split("\n")
    )


def test_a_missing_model_folder_is_one_error(tmp_path):
    done = _run(tmp_path, MODEL=str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no model folder" in done.stderr
