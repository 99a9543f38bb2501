"""The study's secondary questions (sparrow/experiments/study_secondary.py): the per-unit
divergence and early raise from step rows, and the three answers, read on seeds 1 and 2 only.

Run: `python -m pytest tests/experiments/test_study_secondary.py -q`.
"""

from __future__ import annotations

import pytest

from sparrow.experiments.study_analysis import Unit
from sparrow.experiments.study_secondary import (
    divergence,
    divergence_question,
    raise_question,
    raised_early,
    tis_question,
)

START = 0.34


def unit(seed: int, arm: str, outcome: float, **extra) -> Unit:
    """A unit of 100 steps whose label follows from its outcome (dense at 0.98): stable at
    0.95 and up, destabilized below the start."""
    return Unit(
        variant="v2", seed=seed, arm=arm, outcome=outcome, gap=outcome - 0.98, start=START,
        peak=max(outcome, START), peak_step=10, steps=100, extra=extra,
    )  # fmt: skip


def test_divergence_is_the_largest_reward_minus_eval_from_step_20():
    rows = [{"step": s, "reward/mean": 0.6} for s in range(1, 31)]
    rows[9]["eval/accuracy"] = 0.0  # step 10: before step 20, not counted
    rows[19]["eval/accuracy"] = 0.5  # 0.6 - 0.5
    rows[29]["eval/accuracy"] = 0.1  # 0.6 - 0.1
    assert divergence(rows) == pytest.approx(0.5)
    rows[29]["eval/accuracy"] = 0.9
    assert divergence(rows) == pytest.approx(0.1)
    assert divergence([{"step": 10, "reward/mean": 0.5, "eval/accuracy": 0.0}]) is None


def test_raised_early_reads_the_schedule_version_of_steps_1_to_5():
    flat = [{"step": s, "schedule/version": 1.0} for s in range(0, 7)]
    assert raised_early(flat) is False
    assert raised_early([*flat[:6], {"step": 6, "schedule/version": 2.0}]) is False
    flat[3]["schedule/version"] = 2.0
    assert raised_early(flat) is True
    assert raised_early([{"step": 7, "schedule/version": 3.0}]) is None


def test_tis_counts_seeds_1_and_2_only():
    base = [unit(0, "notis-0.75", 0.75), unit(0, "centroid-0.75", 0.0)]
    assert tis_question(base)["answer"] == "pending"
    seeds = base + [unit(1, "notis-0.75", 0.5), unit(1, "centroid-0.75", 0.1)]
    assert tis_question(seeds)["answer"] == "pending"
    both = seeds + [unit(2, "notis-0.75", 0.4), unit(2, "centroid-0.75", 0.3)]
    assert tis_question(both)["answer"] == "repeats"
    assert tis_question(both)["differences"][2] == pytest.approx(0.1)
    mixed = seeds + [unit(2, "notis-0.75", 0.3), unit(2, "centroid-0.75", 0.3)]
    assert tis_question(mixed)["answer"] == "mixed"
    none = base + [
        unit(s, a, o) for s in (1, 2) for a, o in (("notis-0.75", 0.2), ("centroid-0.75", 0.9))
    ]
    assert tis_question(none)["answer"] == "does not repeat"


def test_raise_holds_when_every_centroid_unit_is_stable_exactly_when_raised():
    units = [
        unit(s, arm, outcome, raised_early=raised)
        for s in (1, 2)
        for arm, outcome, raised in (
            ("centroid-0.75", 0.0, False),
            ("centroid-0.86", 0.97, True),
            ("rule-0.86", 0.97, False),  # not a centroid arm: not asked
        )
    ]
    assert raise_question(units) == {"units": 4, "breaks": [], "answer": "holds"}
    units.append(unit(2, "centroid-0.92", 0.0, raised_early=True))
    assert raise_question(units)["breaks"] == ["s2 centroid-0.92"]
    assert raise_question(units)["answer"] == "fails"
    assert raise_question(units[:3])["answer"] == "pending"  # seed 2 missing


def test_divergence_above_the_bar_is_a_sign_only_when_every_such_unit_is_not_stable():
    seed0 = unit(0, "rule-0.80", 0.97, divergence=0.9)  # stable and above: seed 0 not counted
    units = [
        seed0,
        unit(1, "rule-0.86", 0.0, divergence=0.6),
        unit(1, "centroid-0.86", 0.97, divergence=0.0),
        unit(2, "rule-0.86", 0.0, divergence=0.1),
        unit(2, "centroid-0.86", 0.97, divergence=-0.1),
        unit(2, "dense", 0.98, divergence=0.9),  # not sparse: not counted
    ]
    answer = divergence_question(units)
    assert answer["answer"] == "a sign of trouble" and answer["above_bar"] == 1
    assert answer["units"] == 4 and answer["auc"] == pytest.approx(1.0)
    units.append(unit(2, "centroid-0.92", 0.97, divergence=0.4))
    assert divergence_question(units)["answer"] == "not specific"
    calm = [u for u in units[2:5]] + [unit(1, "fixed", 0.0, divergence=0.2)]
    assert divergence_question(calm)["answer"] == "no event"
    assert divergence_question([seed0])["answer"] == "pending"
