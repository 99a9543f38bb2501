"""scripts/study_merge_holds.py: two holds of one seed become the one folder the analysis
reads; gaps are taken against the dense arm of whichever hold ran it; a calibration that
differs between holds is said; holds from other starting weights, or other bad input, are one
error and write nothing."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "study_merge_holds.py"
CALIBRATION = ["calibration_id", "topk_pages", "bin", "n", "p1", "p5", "p10", "mean", "created_at"]


def _calibration(path: Path, tables: dict[str, list[float]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CALIBRATION)
        for cal_id, p5s in tables.items():
            for topk, p5 in zip((2, 4), p5s):
                writer.writerow([cal_id, topk, 0, 100, p5 - 0.1, p5, p5 + 0.01, 0.99, cal_id])


def _hold(root: Path, name: str, arms: dict[str, float | None], tables: dict, start=0.3) -> Path:
    hold = root / name
    (hold / "report").mkdir(parents=True)
    summary = {"study_id": "v2-s0", "variant": "v2", "start": {"accuracy": start}, "arms": {}}
    for arm, accuracy in arms.items():
        entry = {"steps_done": 100}
        if accuracy is not None:
            entry["outcome"] = {"accuracy": accuracy}
        summary["arms"][arm] = entry
        (hold / f"{arm}_steps.csv").write_text(f"step,arm\n1,{arm}\n")
        (hold / f"{arm}_bins.csv").write_text("step,bin\n1,0\n")
        (hold / f"{arm}_samples.csv.gz").write_bytes(gzip.compress(f"step,arm\n1,{arm}\n".encode()))
    (hold / "summary.json").write_text(json.dumps(summary))
    report = {"arms": [{"arm": a, "predicted_eflops_per_step": 1.0} for a in arms]}
    (hold / "report" / "summary.json").write_text(json.dumps(report))
    _calibration(hold / "calibration.csv", tables)
    return hold


def _merge(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


SAME = {"centroid": [0.2, 0.9], "quest": [0.5, 0.95]}


def test_two_holds_merge_into_one_seed_with_gaps_to_the_other_holds_dense(tmp_path):
    a = _hold(
        tmp_path,
        "holdA",
        {"dense": 0.6, "fixed": 0.2, "rule-0.86": 0.55},
        {"c1": SAME["centroid"], "q1": SAME["quest"]},
        start=0.31,
    )
    b = _hold(
        tmp_path,
        "holdB",
        {"centroid-0.92": 0.62, "notis-0.75": None},
        {"c7": SAME["centroid"], "c8": SAME["centroid"], "q9": SAME["quest"]},
        start=0.29,
    )
    out = tmp_path / "v2-s0"
    done = _merge(a, b, "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("calibration reproduced") == 2
    merged = json.loads((out / "summary.json").read_text())
    gaps = {arm: e["gap_to_dense"] for arm, e in merged["arms"].items()}
    assert gaps["centroid-0.92"] == pytest.approx(0.02)
    assert gaps["fixed"] == pytest.approx(-0.4) and gaps["notis-0.75"] is None
    assert merged["start"] == {"accuracy": 0.31}  # the dense arm's hold
    assert [h["start"]["accuracy"] for h in merged["holds"]] == [0.31, 0.29]
    assert (out / "notis-0.75_steps.csv").read_text() == "step,arm\n1,notis-0.75\n"
    # the gzip-compressed tables travel with the plain ones
    assert gzip.decompress((out / "notis-0.75_samples.csv.gz").read_bytes()) == (
        b"step,arm\n1,notis-0.75\n"
    )
    report = json.loads((out / "report" / "summary.json").read_text())
    assert sorted(a["arm"] for a in report["arms"]) == sorted(merged["arms"])


def test_a_calibration_that_differs_between_holds_is_said(tmp_path):
    a = _hold(tmp_path, "holdA", {"dense": 0.6}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"centroid-0.82": 0.5}, {"c2": [0.21, 0.9]})
    done = _merge(a, b, "--out", tmp_path / "v2-s0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("NOT reproduced") == 2
    merged = json.loads((tmp_path / "v2-s0" / "summary.json").read_text())
    assert [h["calibration_reproduced"] for h in merged["holds"]] == [False, False]


def test_a_rule_only_one_hold_calibrated_is_counted_apart(tmp_path):
    """Seed 0 of 2026-11-29: hold 1 calibrated centroid only, hold 2 centroid and quest."""
    a = _hold(tmp_path, "holdA", {"dense": 0.6}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"rule-0.86": 0.5}, {"c2": SAME["centroid"], "q3": SAME["quest"]})
    done = _merge(a, b, "--out", tmp_path / "v2-s0")
    assert done.returncode == 0, done.stderr
    assert "calibration reproduced (1 of 1 distinct tables" in done.stdout
    assert "calibration NOT reproduced (1 of 2 distinct tables" in done.stdout
    merged = json.loads((tmp_path / "v2-s0" / "summary.json").read_text())
    shared = [(h["calibration_tables_shared"], h["calibration_tables"]) for h in merged["holds"]]
    assert shared == [(1, 1), (1, 2)]


def test_an_arm_in_two_holds_is_one_error_and_nothing_is_written(tmp_path):
    a = _hold(tmp_path, "holdA", {"dense": 0.6, "fixed": 0.2}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"fixed": 0.3}, {"c2": SAME["centroid"]})
    done = _merge(a, b, "--out", tmp_path / "v2-s0")
    assert done.returncode != 0 and "arm fixed is in two holds" in done.stderr
    assert not (tmp_path / "v2-s0").exists()


def test_an_existing_output_folder_is_left_as_it_was(tmp_path):
    a = _hold(tmp_path, "holdA", {"dense": 0.6}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"fixed": 0.3}, {"c2": SAME["centroid"]})
    out = tmp_path / "v2-s0"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = _merge(a, b, "--out", out)
    assert done.returncode != 0 and "already exists" in done.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_holds_of_different_seeds_do_not_merge(tmp_path):
    a = _hold(tmp_path, "holdA", {"dense": 0.6}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"fixed": 0.3}, {"c2": SAME["centroid"]})
    summary = json.loads((b / "summary.json").read_text())
    (b / "summary.json").write_text(json.dumps(summary | {"study_id": "v2-s1"}))
    done = _merge(a, b, "--out", tmp_path / "v2-s0")
    assert done.returncode != 0 and "v2-s1" in done.stderr
    assert not (tmp_path / "v2-s0").exists()


def test_holds_from_different_weights_do_not_merge_and_same_weights_are_recorded(tmp_path):
    a = _hold(tmp_path, "holdA", {"dense": 0.6}, {"c1": SAME["centroid"]})
    b = _hold(tmp_path, "holdB", {"fixed": 0.3}, {"c2": SAME["centroid"]})
    for hold, sha in ((a, "aa11"), (b, "bb22")):
        (hold / "model.json").write_text(json.dumps({"model_safetensors_sha256": sha}))
    done = _merge(a, b, "--out", tmp_path / "v2-s0")
    assert done.returncode != 0 and "aa11" in done.stderr and "bb22" in done.stderr
    assert not (tmp_path / "v2-s0").exists()

    (b / "model.json").write_text(json.dumps({"model_safetensors_sha256": "aa11"}))
    assert _merge(a, b, "--out", tmp_path / "v2-s0").returncode == 0
    merged = json.loads((tmp_path / "v2-s0" / "summary.json").read_text())
    assert merged["model_safetensors_sha256"] == "aa11"


def test_a_real_seed_split_and_merged_reads_as_the_whole_seed(tmp_path):
    """The timing pilot's folder (nine arms, one hold) cut into two holds by arm and merged:
    the analysis's units are the same as read from the whole folder."""
    import shutil

    sys.path.insert(0, str(ROOT / "scripts"))
    from study_analysis import load_units

    pilot = ROOT / "benchmarks/results/h200-2026-11-28/pilot-v2-s100"
    whole = tmp_path / "v2-s100"
    shutil.copytree(pilot, whole)
    summary = json.loads((pilot / "summary.json").read_text())
    report = json.loads((pilot / "report" / "summary.json").read_text())
    first = {"dense", "fixed", "centroid-0.75", "centroid-0.86", "rule-0.86"}
    holds = []
    for name, keep in (("holdA", first), ("holdB", set(summary["arms"]) - first)):
        hold = tmp_path / name
        (hold / "report").mkdir(parents=True)
        part = summary | {"arms": {a: e for a, e in summary["arms"].items() if a in keep}}
        (hold / "summary.json").write_text(json.dumps(part))
        arms = [a for a in report["arms"] if a["arm"] in keep]
        (hold / "report" / "summary.json").write_text(json.dumps(report | {"arms": arms}))
        shutil.copy(pilot / "calibration.csv", hold / "calibration.csv")
        for arm in keep:
            for path in pilot.glob(f"{arm}_*.csv"):
                shutil.copy(path, hold / path.name)
        holds.append(hold)
    merged = tmp_path / "merged" / "v2-s100"
    done = _merge(*holds, "--out", merged)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("calibration reproduced") == 2
    want, want_costs = load_units([whole])
    got, got_costs = load_units([merged])
    key = lambda u: u.arm  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)
    assert got_costs == want_costs
