"""The pre-registered analysis (sparrow/experiments/study_analysis.py, scripts/study_analysis.py)
on made-up units whose answers are known by hand."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sparrow.experiments.study_analysis import (
    Unit,
    inconclusive,
    label,
    non_inferior,
    one_sided_lower,
    predictor_auc,
    rule_sufficient,
    seed_bootstrap,
    transfer,
)

ROOT = Path(__file__).resolve().parents[2]


def unit(arm="centroid-0.86", seed=0, outcome=0.8, gap=0.0, start=0.3, peak=None, peak_step=None,
         steps=100, variant="v2", **stats) -> Unit:  # fmt: skip
    return Unit(variant, seed, arm, outcome, gap, start, peak, peak_step, steps, stats)


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, "stable"),
        ({"gap": -0.05}, "stable"),  # the margin itself is inside
        ({"gap": -0.06}, "stalled"),
        ({"steps": 99}, "stalled"),  # ran out of steps: not stable, flagged by the report
        ({"outcome": 0.24, "start": 0.3, "gap": 0.0}, "destabilized"),  # below start - 0.05
        ({"outcome": 0.7, "peak": 0.85, "peak_step": 40}, "destabilized"),  # learnt, then fell
        ({"outcome": 0.7, "peak": 0.85, "peak_step": 30}, "stable"),  # a peak by step 30 only
        ({"steps": 49}, None),  # under 50 steps: missing
        ({"outcome": None}, None),
    ],
)
def test_labels_follow_the_registered_rules_in_order(kwargs, want):
    assert label(unit(**kwargs)) == want


def test_auc_is_oriented_per_statistic_and_undefined_with_one_label():
    good = [unit(seed=s, p5_all=0.9, S_all=1.0) for s in range(3)]
    bad = [unit(seed=s, gap=-0.3, p5_all=0.5, S_all=9.0, arm="fixed") for s in range(3)]
    assert predictor_auc(good + bad, "p5_all") == 1.0
    assert predictor_auc(good + bad, "S_all") == 1.0  # a lower S looks fine
    assert predictor_auc(good, "p5_all") is None
    dense = [unit(arm="dense", seed=s, p5_all=0.0) for s in range(3)]  # never a sparse unit
    assert predictor_auc(good + bad + dense, "p5_all") == 1.0


def test_the_bootstrap_draws_whole_seeds():
    """Seed 0 separates perfectly, seed 1 backwards: a draw of seed 0 twice gives 1, of seed
    1 twice 0, so the interval spans both; a statistic that separates in every seed has a
    point interval at 1."""
    units = [
        unit(seed=0, p5_all=0.9, stat=1.0), unit(seed=0, arm="fixed", gap=-0.3, p5_all=0.1, stat=0.0),
        unit(seed=1, p5_all=0.1, stat=1.0), unit(seed=1, arm="fixed", gap=-0.3, p5_all=0.9, stat=0.0),
    ]  # fmt: skip
    low, high = seed_bootstrap(units, lambda s: predictor_auc(s, "p5_all"), resamples=400)
    assert (low, high) == (0.0, 1.0)
    assert seed_bootstrap(units, lambda s: predictor_auc(s, "stat"), resamples=100) == (1.0, 1.0)


def test_the_one_sided_t_bound_by_hand():
    # mean 0, sd 0.02, t(0.95, 2) = 2.919986: 0 - 2.919986 * 0.02 / sqrt(3)
    assert one_sided_lower([0.0, -0.02, 0.02]) == pytest.approx(-2.919986 * 0.02 / math.sqrt(3))
    assert one_sided_lower([0.1]) is None


def test_non_inferiority_needs_every_check():
    gaps = [0.0, 0.01, -0.01]
    arm = [unit(arm="rule-0.86", seed=s, gap=g) for s, g in enumerate(gaps)]
    assert non_inferior(arm, "rule-0.86", 0.25)["non_inferior"]
    assert not non_inferior(arm, "rule-0.86", 0.31)["non_inferior"]  # too dear
    assert not non_inferior(arm, "rule-0.86", None)["non_inferior"]  # no price
    short = arm[:2] + [unit(arm="rule-0.86", seed=2, gap=-0.01, steps=90)]
    assert not non_inferior(short, "rule-0.86", 0.25)["all_100_steps"]
    wide = [unit(arm="rule-0.86", seed=s, gap=g) for s, g in enumerate([0.05, -0.1, 0.0])]
    assert not non_inferior(wide, "rule-0.86", 0.25)["gap_lower_bound"]


def test_question_c():
    def arms(rule_gaps, centroid_gaps):
        return [unit(arm="rule-0.86", seed=s, gap=g) for s, g in enumerate(rule_gaps)] + [
            unit(arm="centroid-0.86", seed=s, gap=g) for s, g in enumerate(centroid_gaps)
        ]

    assert rule_sufficient(arms([0, 0, 0], [-0.2, -0.2, 0]))["answer"] == "yes"
    assert rule_sufficient(arms([-0.2, -0.2, 0], [-0.2, -0.2, -0.2]))["answer"] == "no"
    assert rule_sufficient(arms([-0.2, 0, 0], [0, 0, 0]))["answer"] == "moot"
    assert rule_sufficient(arms([-0.2, 0, 0], [-0.2, 0, 0]))["answer"] == "open"


def test_inconclusive_reasons():
    dense = [unit(arm="dense", seed=s, outcome=0.35, start=0.3) for s in range(3)]
    fixed = [unit(arm="fixed", seed=s) for s in range(3)]
    reasons = inconclusive(dense + fixed)
    assert any("dense gained under 0.10" in r for r in reasons)
    assert any("fixed arm came out stable" in r for r in reasons)
    assert any("every sparse unit is stable" in r for r in reasons)
    learnt = [unit(arm="dense", seed=s, outcome=0.9, start=0.3) for s in range(3)]
    mixed = [unit(arm="fixed", seed=s, gap=-0.5) for s in range(3)] + [unit(arm="rule-0.86")]
    assert inconclusive(learnt + mixed) == []


def test_youdens_threshold_from_one_variant_labels_the_other():
    v2 = [unit(seed=s, p5_all=0.9) for s in range(3)] + [
        unit(seed=s, arm="fixed", gap=-0.3, p5_all=0.4) for s in range(3)
    ]
    v3 = [unit(seed=s, variant="v3", p5_all=0.8) for s in range(3)] + [
        unit(seed=s, variant="v3", arm="fixed", gap=-0.3, p5_all=0.5 + 0.2 * s) for s in range(3)
    ]
    found = transfer(v2, v3, "p5_all")
    assert found["threshold"] == pytest.approx(0.65)  # halfway between V2's two classes
    # V3: the stable units (0.8) and one not-stable unit (0.5) right, 0.7 and 0.9 wrong
    assert found["share_right"] == pytest.approx(4 / 6) and not found["transfers"]
    assert not found["one_label"] and found["dense_stable"] is None  # no dense unit in v3


def test_a_transfer_to_units_of_one_label_is_flagged_and_the_dense_units_read():
    v2 = [unit(seed=s, p5_all=0.9) for s in range(3)] + [
        unit(seed=s, arm="fixed", gap=-0.3, p5_all=0.4) for s in range(3)
    ]
    # V3: every sparse unit not stable and low; dense as low: "right" for all, telling nothing
    v3 = [unit(seed=s, variant="v3", arm="fixed", gap=-0.3, p5_all=0.1) for s in range(3)]
    v3 += [unit(seed=s, variant="v3", arm="dense", gap=0.0, p5_all=0.1 + s) for s in range(3)]
    found = transfer(v2, v3, "p5_all")
    assert found["share_right"] == 1.0 and found["transfers"] and found["one_label"]
    assert found["dense_stable"] == pytest.approx(2 / 3)  # 1.1 and 2.1 above 0.65, 0.1 not


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)


def _two_seeds(tmp_path: Path) -> None:
    """Two seeds of one variant, two arms, files as scripts/study_outcome.py writes them."""
    for seed in (0, 1):
        folder = tmp_path / f"v2-s{seed}"
        (folder / "report").mkdir(parents=True)
        arms = {
            "dense": {"steps_done": 100, "outcome": {"accuracy": 0.8}, "gap_to_dense": 0.0},
            "fixed": {"steps_done": 100, "outcome": {"accuracy": 0.3}, "gap_to_dense": -0.5},
        }
        (folder / "summary.json").write_text(
            json.dumps({"arms": arms, "start": {"accuracy": 0.32}})
        )
        (folder / "report" / "summary.json").write_text(
            json.dumps({"arms": [{"arm": "dense", "predicted_eflops_per_step": 10.0},
                                 {"arm": "fixed", "predicted_eflops_per_step": 2.0}]})
        )  # fmt: skip
        for arm, p5 in (("dense", 0.99), ("fixed", 0.2)):
            _write(folder / f"{arm}_steps.csv", [
                {"step": s, "eval/accuracy": 0.5 if s == 10 else "", "mismatch/ess": 0.9,
                 "mismatch/sequence_mismatch_mean": 1 - p5} for s in range(1, 101)
            ])  # fmt: skip
            _write(folder / f"{arm}_bins.csv", [
                {"step": s, "bin": b, "p5": p5 + 0.01 * b, "p1": p5, "p10": p5, "mean": p5,
                 "min": p5, "share_below_half": 1 - p5, "ks": 0.1, "counted": True}
                for s in range(1, 101) for b in (0, 1)
            ])  # fmt: skip
        _write(folder / "fixed_roles.csv", [
            {"step": s, "role": role, "tokens": 10, "p5": p5 if s <= 20 else p5 / 2,
             "p1": 0.0, "mean": 0.9, "share_below_half": 0.1}
            for s in range(1, 101) for role, p5 in (("lookup", 0.4), ("local", 0.8))
        ])  # fmt: skip
        if seed == 1:  # p0.1 kept for the later seed only (`<arm>_tail.csv`)
            _write(folder / "fixed_tail.csv", [
                {"step": s, "bin": b, "tokens": 500, "p0_1": 0.01 * b} for s in range(1, 101)
                for b in (0, 1)
            ])  # fmt: skip


def _analyse(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/study_analysis.py", str(tmp_path / "v2-s0"),
         str(tmp_path / "v2-s1"), "--out", str(tmp_path / "analysis"), "--resamples", "50",
         *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_script_reads_seed_folders_and_writes_the_analysis(tmp_path):
    _two_seeds(tmp_path)
    out = tmp_path / "analysis"
    done = _analyse(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "analysis.json").read_text())["variants"]["v2"]
    assert [u["label"] for u in result["units"]] == ["stable", "stalled"] * 2
    p5 = next(p for p in result["a_predictors"] if p["statistic"] == "p5_first20")
    assert p5["units"] == 2 and p5["not_stable"] == 2 and p5["auc"] is None  # one label only
    (fixed,) = result["b_non_inferior"]
    assert fixed["cost_ratio"] == pytest.approx(0.2) and not fixed["non_inferior"]
    assert "every sparse unit is stalled: no AUC" in result["inconclusive"]
    text = (out / "analysis.md").read_text()
    assert "| 1 | fixed | 100 | 0.300 | -0.500 | stalled |" in text
    assert "| AUC - p5_first20's [paired CI] |" in text
    assert "| (the base) |" in text
    roles = result["units"][1]["roles"]  # seed 0's fixed arm
    assert roles["lookup"]["p5_first20"] == pytest.approx(0.4)
    assert roles["lookup"]["p5_all"] == pytest.approx((20 * 0.4 + 80 * 0.2) / 100)
    assert roles["local"]["share_below_half_all"] == pytest.approx(0.1)
    assert result["units"][0]["roles"] == {}  # dense kept no role table here
    assert "| seed | arm | label | lookup p5 | local p5 | lookup <0.5 | local <0.5 |" in text
    assert "| 0 | fixed | stalled | 0.240 | 0.480 | 0.100 | 0.100 |" in text
    tail = next(p for p in result["a_predictors"] if p["statistic"] == "p0.1_all")
    assert tail["units"] == 1
    assert "p0.1: stored for 1 of 2 sparse units only" in text and "Not stored" not in text


def test_arms_left_out_are_said_to_be_an_exploratory_reading(tmp_path):
    _two_seeds(tmp_path)
    done = _analyse(tmp_path, "--exclude-arms", "fixed")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert result["excluded_arms"] == ["fixed"]
    assert [u["arm"] for u in result["variants"]["v2"]["units"]] == ["dense", "dense"]
    text = (tmp_path / "analysis" / "analysis.md").read_text()
    assert text.startswith("# Study analysis: exploratory, NOT the pre-registered reading")
    assert "Arms left out of every table: fixed." in text
    # an arm no folder has, or the reference arm, is one error and writes nothing
    for arms, says in (("fixed,nosuch", "['nosuch'], not arms"), ("dense", "cannot leave out")):
        (tmp_path / "analysis" / "analysis.json").unlink(missing_ok=True)
        done = _analyse(tmp_path, "--exclude-arms", arms)
        assert done.returncode == 2 and says in done.stderr
        assert not (tmp_path / "analysis" / "analysis.json").exists()


def test_mismatch_per_step_from_roles_by_hand():
    from sparrow.experiments.study_analysis import mismatch_per_step_from_roles

    roles = [
        {"step": 1, "role": "lookup", "tokens": 10, "mean": 0.9},  # 1.0
        {"step": 1, "role": "local", "tokens": 100, "mean": 0.99},  # 1.0
        {"step": 2, "role": "lookup", "tokens": 4, "mean": 0.5},  # 2.0
        {"step": 3, "role": "lookup", "tokens": 4, "mean": 0.0},  # no trajectory count: left out
    ]
    trajectories = {1: 2, 2: 4}
    assert mismatch_per_step_from_roles(roles, trajectories, "lookup") == pytest.approx(
        {1: 0.5, 2: 0.5}
    )
    assert mismatch_per_step_from_roles(roles, trajectories) == pytest.approx({1: 1.0, 2: 0.5})
    assert mismatch_per_step_from_roles(roles, trajectories, "benign") == {1: 0.0, 2: 0.0}
    assert mismatch_per_step_from_roles(roles, {4: 1}, "lookup") == {}


def test_the_role_table_gives_each_steps_mean_s_of_a_real_seed():
    """Over every role, the derivation from a kept seed's role table equals the mean of
    sample_stats' S per step (the same tokens, the same trajectories): what makes the lookup
    rows' sum "S over lookups" for seeds whose sample_stats did not record it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from study_analysis import read_csv

    from sparrow.experiments.study_analysis import mismatch_per_step_from_roles

    folder = ROOT / "benchmarks/results/h200-2026-11-29/v2-s1/v2-s1"
    for arm in ("centroid-0.86", "fixed"):
        samples = read_csv(folder / f"{arm}_samples.csv")
        by_step: dict[int, list[float]] = {}
        for row in samples:
            by_step.setdefault(int(row["step"]), []).append(row["mismatch_sum"])
        derived = mismatch_per_step_from_roles(
            read_csv(folder / f"{arm}_roles.csv"), {s: len(v) for s, v in by_step.items()}
        )
        assert len(derived) == len(by_step) == 100
        for step, sums in by_step.items():
            assert derived[step] == pytest.approx(sum(sums) / len(sums), rel=1e-9)
        lookup = mismatch_per_step_from_roles(
            read_csv(folder / f"{arm}_roles.csv"),
            {s: len(v) for s, v in by_step.items()},
            "lookup",
        )
        assert all(0 <= lookup[s] <= derived[s] for s in by_step)
        assert sum(lookup[s] > 0 for s in by_step) > 50


def test_worst_tail_per_step_reads_only_the_bins_bin_stats_counted():
    from sparrow.experiments.study_analysis import worst_tail_per_step

    bins = [
        {"step": 1, "bin": 0, "counted": True},
        {"step": 1, "bin": 1, "counted": False},  # below the floor: left out
        {"step": 2, "bin": 0, "counted": True},
        {"step": 2, "bin": 1, "counted": True},
    ]
    tail = [
        {"step": 1, "bin": 0, "p0_1": 0.4},
        {"step": 1, "bin": 1, "p0_1": 0.01},
        {"step": 2, "bin": 0, "p0_1": 0.3},
        {"step": 2, "bin": 1, "p0_1": 0.2},
        {"step": 2, "bin": 2, "p0_1": 0.0},  # no bin_stats row: left out
        {"step": 3, "bin": 0, "p0_1": 0.1},
    ]
    assert worst_tail_per_step(tail, bins) == {1: 0.4, 2: 0.2}
