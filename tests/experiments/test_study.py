"""The study's numbers against plain loops: collapse labels, AUC, worst bin per step, and the
study definition's checks. Run: `python -m pytest tests/experiments/test_study.py -q`."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparrow.config import ConfigError, load_config
from sparrow.config.load import conf_dir
from sparrow.config.study import StudyConfig, load_study, study_from_yaml, study_yaml
from sparrow.costmodel import get_hardware, get_model, schedule_cost
from sparrow.experiments.study import (
    auc,
    collapse_labels,
    last_mean,
    passes_at_target,
    separation,
    step_rollout_cost,
    worst_bounds_mean,
    worst_per_step,
)
from sparrow.sparse import get_preset
from sparrow.sparse.target import get_statistic


def plain_auc(stable, collapsed):
    total = 0.0
    for s in stable:
        for c in collapsed:
            total += 1.0 if s > c else 0.5 if s == c else 0.0
    return total / (len(stable) * len(collapsed))


def test_auc_equals_the_double_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        stable = np.round(rng.random(rng.integers(1, 9)), 1)  # rounding makes ties
        collapsed = np.round(rng.random(rng.integers(1, 9)) - 0.2, 1)
        assert auc(stable, collapsed) == pytest.approx(plain_auc(stable, collapsed))
    assert auc([0.9, 0.8], [0.1]) == 1.0 and auc([0.1], [0.9, 0.8]) == 0.0
    assert auc([0.5], [0.5]) == 0.5
    assert auc([], [0.3]) is None and auc([0.3], []) is None


def test_collapse_compares_the_last_window_with_the_reference():
    rewards = {
        "dense": [0.2, 0.6, 0.8],
        "cheap": [0.2, 0.3, 0.5],
        "ctl": [0.1, 0.7, 0.6],
        "empty": [],
    }
    labels, reference = collapse_labels(rewards, "dense", window=2, ratio=0.8)
    assert reference == pytest.approx(0.7)
    # cheap: (0.3 + 0.5) / 2 = 0.4 < 0.56; ctl: 0.65 >= 0.56
    assert labels == {"dense": False, "cheap": True, "ctl": False, "empty": None}
    assert last_mean([1.0, 2.0], window=5) == 1.5 and last_mean([], 3) is None
    # a reference without reward, or with a mean <= 0, labels nothing
    assert collapse_labels({"dense": [], "x": [0.1]}, "dense", 2, 0.8)[0] == {
        "dense": None,
        "x": None,
    }
    assert collapse_labels({"dense": [0.0], "x": [0.1]}, "dense", 2, 0.8)[0]["x"] is None


def test_worst_bin_per_step_and_separation():
    rows = [
        {"step": s, "bin": b, "p5": p5, "share_below_half": share}
        for s, b, p5, share in [
            (1, 0, 0.9, 0.0),
            (1, 1, 0.7, 0.1),
            (2, 0, 0.95, None),
            (2, 1, 0.8, 0.05),
            (3, 0, None, 0.2),
        ]
    ]
    assert worst_per_step(rows, get_statistic("p5")) == {1: 0.7, 2: 0.8}
    assert worst_per_step(rows, get_statistic("share_below_half")) == {1: 0.1, 2: 0.05, 3: 0.2}
    assert worst_bounds_mean(rows, get_statistic("p5")) is None  # rows without bounds
    per_arm = {
        "dense": {1: 0.99, 2: 0.98},
        "ctl": {1: 0.9, 2: 0.7},
        "cheap": {1: 0.8, 2: 0.5},
        "unlabelled": {1: 0.1},
    }
    labels = {"dense": False, "ctl": False, "cheap": True, "unlabelled": None}
    result = separation(per_arm, labels, get_statistic("p5"))
    assert result["step_auc"] == pytest.approx(plain_auc([0.99, 0.98, 0.9, 0.7], [0.8, 0.5]))
    assert result["arm_auc"] == pytest.approx(plain_auc([0.985, 0.8], [0.65]))
    assert (result["stable_arms"], result["collapsed_arms"]) == (["dense", "ctl"], ["cheap"])
    assert (result["stable_steps"], result["collapsed_steps"]) == (4, 2)
    # lower is better: a high share in the collapsed arm separates perfectly
    shares = {"dense": {1: 0.0}, "cheap": {1: 0.3}}
    flipped = separation(shares, {"dense": False, "cheap": True}, get_statistic("share_below_half"))
    assert flipped["step_auc"] == 1.0 and not flipped["higher_is_better"]
    assert separation(per_arm, {"dense": False}, get_statistic("p5"))["step_auc"] is None


def test_passes_at_target_counts_steps_meeting_each_arms_own_target():
    per_arm = {
        "dense": {1: 0.99, 2: 0.99},
        "p86": {1: 0.9, 2: 0.8, 3: 0.86},
        "p90": {1: 0.88, 2: 0.95},
        "ok": {1: 0.5, 2: 0.95},
        "unlabelled": {1: 0.99},
    }
    labels = {"dense": False, "p86": True, "p90": True, "ok": False, "unlabelled": None}
    targets = {"dense": None, "p86": 0.86, "p90": 0.90, "ok": 0.86, "unlabelled": 0.86}
    result = passes_at_target(per_arm, labels, targets, get_statistic("p5"))
    # collapsed: p86 meets 0.86 at steps 1 and 3, p90 meets 0.90 at step 2 -> 3 of 5
    assert result["collapsed_pass"] == pytest.approx(3 / 5) and result["collapsed_steps"] == 5
    # stable: the dense arm has no target; ok meets 0.86 at step 2 -> 1 of 2
    assert result["stable_pass"] == pytest.approx(1 / 2) and result["stable_steps"] == 2
    none = passes_at_target(per_arm, {"dense": False}, targets, get_statistic("p5"))
    assert none["collapsed_pass"] is None and none["stable_pass"] is None


def test_step_rollout_cost_is_the_cost_models():
    schedule, model, hw = (
        get_preset("qwen3-1.7b-0.86"),
        get_model("qwen3-1.7b"),
        get_hardware("h200"),
    )
    sparse, dense = step_rollout_cost(
        schedule,
        model=model,
        hardware=hw,
        prompt_len=300.4,
        gen_len=20000.2,
        samples_per_prompt=8,
        prompts=3,
    )
    want = schedule_cost(
        schedule,
        model=model,
        hardware=hw,
        prompt_len=300,
        gen_len=20000,
        samples=8,
        scoring="pages",
    )
    assert sparse == pytest.approx(3 * want.sparse.total)
    assert dense == pytest.approx(3 * want.dense.total) and dense > sparse
    assert step_rollout_cost(
        None,
        model=model,
        hardware=hw,
        prompt_len=300,
        gen_len=20000,
        samples_per_prompt=8,
        prompts=3,
    ) == pytest.approx((dense, dense))


def test_the_default_study_loads_and_round_trips():
    study = load_study("default", ["fixed_topk_pages=29", "collapse_ratio=0.7"])
    assert [a.name for a in study.arms] == ["dense", "fixed", "target-0.86", "target-0.90"]
    assert study.arms[0].overrides == ["schedule.sparse=false"] and study.arms[1].fixed_budget
    assert (study.fixed_topk_pages, study.collapse_ratio) == (29, 0.7)
    assert study_from_yaml(study_yaml(study)) == study


def test_every_key_of_the_default_study_has_a_comment():
    lines = (conf_dir() / "study" / "default.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*(- )?\w+:", line):
            assert lines[i - 1].strip().startswith("#"), f"{line.strip()} lacks a comment"


@pytest.mark.parametrize(
    "override, message",
    [
        (["reference_arm=nope"], "reference_arm 'nope' is not an arm"),
        (["collapse_ratio=1.5"], "collapse_ratio must be in"),
        (["fixed_topk_pages=0"], "must be >= 1"),
        (["no_such_key=1"], "unknown config key 'no_such_key'"),
        (["arms"], "not of the form key=value"),
    ],
)
def test_bad_studies_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_study("default", override)


def test_arm_names_must_be_unique_and_usable(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("arms: [{name: a}, {name: a}]\nreference_arm: a\n")
    with pytest.raises(ConfigError, match="unique"):
        load_study(str(path))
    path.write_text("arms: [{name: 'a b'}]\nreference_arm: 'a b'\n")
    with pytest.raises(ConfigError, match="arm name 'a b'"):
        load_study(str(path))
    with pytest.raises(ConfigError, match="studies: default"):
        load_study("missing")
    assert StudyConfig().reference_arm == "dense"
    path.write_text("arms: [{name: a}]\nreference_arm: ''\n")  # a hold without dense
    assert load_study(str(path)).reference_arm == ""


def schedule_keys() -> set[str]:
    from dataclasses import fields

    from sparrow.config.schema import ScheduleConfig

    return {f.name for f in fields(ScheduleConfig)}


@pytest.mark.parametrize("name", sorted(p.stem for p in (conf_dir() / "study").glob("*.yaml")))
def test_every_shipped_study_loads_and_each_arm_config_resolves(name):
    """A typo in sparrow/conf/study/*.yaml (a key, an override) fails here, not on a GPU machine."""
    study = load_study(name)
    for arm in study.arms:
        if "selection" not in schedule_keys() and any(
            o.startswith("schedule.selection=") for o in arm.overrides
        ):
            continue  # the study_v2 / v3 rule arms: schedule.selection lands with its branch
        cfg = load_config([*study.common, *arm.overrides])
        assert cfg.pipeline.steps >= 1, (name, arm.name)


def test_the_preregistered_studies_hold_their_nine_arms():
    from sparrow.config.study import load_study

    for variant in ("v2", "v3"):
        study = load_study(f"study_{variant}")
        arms = {arm.name: arm for arm in study.arms}
        assert list(arms) == [
            "dense", "fixed", "centroid-0.75", "centroid-0.82", "centroid-0.86",
            "centroid-0.92", "rule-0.86", "rule-0.80", "notis-0.75",
        ]  # fmt: skip
        assert arms["fixed"].fixed_budget and study.own_workdirs
        assert "algo.tis_cap=-1" in arms["notis-0.75"].overrides
        assert "data.reward=share_match" in study.common
        assert f"tags={int(variant == 'v3')}" in " ".join(study.common)


def test_the_worst_bin_skips_bins_below_the_floor_and_carries_its_bounds():
    rows = [
        {"step": 1, "bin": 0, "p5": 0.9, "p5_lo": 0.85, "p5_hi": 0.93, "counted": True},
        {"step": 1, "bin": 1, "p5": 0.3, "p5_lo": 0.1, "p5_hi": 0.6, "counted": False},
        {"step": 2, "bin": 0, "p5": 0.8, "p5_lo": 0.75, "p5_hi": 0.87, "counted": True},
        {"step": 2, "bin": 1, "p5": 0.85, "p5_lo": 0.8, "p5_hi": 0.9, "counted": None},
    ]
    p5 = get_statistic("p5")
    assert worst_per_step(rows, p5) == {1: 0.9, 2: 0.8}  # bin 1 of step 1 is too thin
    assert worst_bounds_mean(rows, p5) == pytest.approx((0.8, 0.9))
