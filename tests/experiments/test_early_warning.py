"""sparrow/experiments/early_warning.py: collapses of the sparse actor's reward, the steps
before them, and how well a step statistic ranks those steps.

Run: `python -m pytest tests/experiments/test_early_warning.py -q`.
"""

from __future__ import annotations

import pytest

from sparrow.experiments import early_warning as ew


def _rows(rewards: list[float], **columns: list[float]) -> list[dict]:
    """Step rows 1..N with the reward and any named signal columns (by their CSV column)."""
    rows = []
    for i, reward in enumerate(rewards):
        row = {"step": float(i + 1), ew.REWARD: reward}
        row.update({column: values[i] for column, values in columns.items()})
        rows.append(row)
    return rows


def test_a_collapse_is_a_fall_below_the_share_of_an_earning_baseline():
    earning = {s: 0.6 for s in range(1, 21)} | {21: 0.1} | {s: 0.6 for s in range(22, 41)}
    assert ew.onsets(earning) == [21]
    # 0.3 is not below 0.4 x 0.6 = 0.24: a dip, not a collapse
    assert ew.onsets(earning | {21: 0.3}) == []
    # from a baseline under HEALTHY nothing collapses: the actor was not earning
    assert ew.onsets({s: 0.2 for s in range(1, 21)} | {21: 0.0}) == []
    # a second fall within AFTER steps is the same collapse; later it is a new one
    assert ew.onsets(earning | {25: 0.0}) == [21]
    assert ew.onsets(earning | {38: 0.0}) == [21, 38]


def test_the_steps_before_a_collapse_are_positive_and_those_after_are_left_out():
    earning = {s: 0.6 for s in range(1, 21)} | {21: 0.1} | {s: 0.6 for s in range(22, 41)}
    labels = ew.step_labels(earning)
    assert [s for s, before in labels.items() if before] == list(range(16, 21))
    assert not any(21 <= s <= 31 for s in labels)  # the collapse and AFTER steps
    assert 32 in labels and labels[32] is False
    assert 40 not in labels  # its HORIZON runs past the run
    assert 4 not in labels  # no full WINDOW up to it


def test_relative_signals_divide_by_the_trailing_median_and_keep_the_orientation():
    rows = _rows([0.5] * 12, **{"actor/approx_kl": [1.0] * 11 + [3.0]})
    assert ew.warning_values(rows, "approx_kl")[12] == 3.0
    assert ew.warning_values(rows, "approx_kl_rel") == {11: 1.0, 12: 3.0}
    low_is_bad = _rows([0.5] * 3, **{"mismatch/min_p5": [0.9, 0.8, 0.1]})
    assert ew.warning_values(low_is_bad, "p5_worst_bin")[3] == pytest.approx(-0.1)


def _collapsing_unit(signal_rises: bool) -> dict:
    rewards = [0.6] * 30 + [0.05] + [0.6] * 29 + [0.0] + [0.6] * 19
    kl = [1e-6] * 80
    if signal_rises:
        for start in (31, 61):  # steps start-3 .. start-1 (1-based) warn
            for step in range(start - 3, start):
                kl[step - 1] = 1e-5
    return {"name": "u", "rows": _rows(rewards, **{"actor/approx_kl": kl})}


def test_a_signal_that_rises_before_each_collapse_ranks_those_steps_first():
    rising, flat = _collapsing_unit(True), _collapsing_unit(False)
    assert ew.onsets(ew.rewards(rising["rows"])) == [31, 61]
    assert ew.pooled_auc([rising], "approx_kl") > 0.75
    assert ew.pooled_auc([flat], "approx_kl") == 0.5  # all tied
    assert ew.pooled_auc([rising], "step") is not None
    threshold = ew.youden([rising], "approx_kl")
    assert threshold == pytest.approx(1e-5)
    rates = ew.alarm_rates([rising], "approx_kl", threshold)
    assert rates["collapses"] == 2 and rates["warned"] == 2 and rates["false_alarms"] == 0
    assert ew.alarm_rates([flat], "approx_kl", threshold)["warned"] == 0


def test_the_bootstrap_resamples_whole_units_and_pairs_the_difference():
    units = [_collapsing_unit(True), _collapsing_unit(False)]
    per_unit = [ew.unit_pairs(u, "approx_kl") for u in units]
    low, high = ew.unit_bootstrap(per_unit, resamples=200)
    assert 0.5 <= low <= high <= 1.0 and low < high  # drawing the flat unit alone: 0.5
    # a signal against itself differs by exactly 0 in every draw
    assert ew.unit_bootstrap(per_unit, per_unit, resamples=50) == (0.0, 0.0)
    # no collapse anywhere: undefined, not a number
    quiet = {"name": "q", "rows": _rows([0.6] * 40, **{"actor/approx_kl": [1e-6] * 40})}
    assert ew.pooled_auc([quiet], "approx_kl") is None
    assert ew.unit_bootstrap([ew.unit_pairs(quiet, "approx_kl")], resamples=20) == (None, None)
    table = ew.report(units, resamples=50)
    assert {row["signal"] for row in table} == set(ew.SIGNALS)
    assert next(r for r in table if r["signal"] == "reward")["minus_reward"] == 0.0
