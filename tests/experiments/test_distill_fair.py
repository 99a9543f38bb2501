"""The fair test's verdict (sparrow/experiments/distill_fair.py) on hand-made seeds: each
outcome the plan names, and the figures read from a benchmark report."""

from __future__ import annotations

import pytest

from sparrow.experiments.distill_fair import seed_row, verdict


def row(seed, low, p5_lora=0.80):
    return {"seed": seed, "low": low, "high": low + 0.02, "delta": low + 0.01, "p5_lora": p5_lora}


@pytest.mark.parametrize(
    "lows, expected",
    [
        ([0.01, 0.002, 0.03], "helps"),
        ([0.01, 0.0, 0.03], "inconclusive"),  # one interval reaches 0
        ([0.01, -0.01, 0.0], "refuted"),  # two do not lie above 0
        ([-0.02, -0.01, -0.03], "refuted"),
        ([0.01, 0.02], "incomplete"),  # the plan asks for three seeds
    ],
)
def test_each_outcome_the_plan_names(lows, expected):
    result = verdict([row(s, low) for s, low in enumerate(lows)])
    assert result["lora_helps"] == expected
    assert result["interval_above_zero"] == [s for s, low in enumerate(lows) if low > 0]


def test_enough_to_switch_needs_every_seed_at_the_target():
    assert verdict([row(s, 0.01, 0.87) for s in range(3)])["enough_to_switch"] is True
    lows = [row(0, 0.01, 0.87), row(1, 0.01, 0.85), row(2, 0.01, 0.90)]
    result = verdict(lows)
    assert result["enough_to_switch"] is False and result["reached_target"] == [0, 2]
    assert verdict([row(0, 0.01, 0.9)])["enough_to_switch"] is False  # one seed is not three


def test_a_seeds_figures_come_from_the_fixed_set():
    paired = {"delta": 0.02, "low": 0.01, "high": 0.03}
    report = {
        "steps": [{}] * 40,
        "fixed_set": {
            "prompts": 16,
            "tokens": 9000,
            "after_lora": {"p5": 0.81},
            "after_base": {"p5": 0.79},
            "lora_minus_base_after": {"p5": paired, "mean": {"delta": 9, "low": 9, "high": 9}},
        },
    }
    got = seed_row(2, report)
    assert got == {
        "seed": 2,
        **paired,
        "p5_lora": 0.81,
        "p5_base": 0.79,
        "prompts": 16,
        "tokens": 9000,
        "steps": 40,
    }
