"""The online controller: crossings with tolerance and patience, lowering on margin, and the
new schedule built from a re-measurement (checked against hand-worked cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparrow.control.controller import (
    ControllerError,
    ControlSettings,
    Decision,
    apply_measurement,
    candidate_topk_pages,
    confirm_raises,
    decide,
)
from sparrow.sparse.schedule import Schedule

SCHEDULE = Schedule("s", (4, 6, 8, 8), page_size=8, bin_tokens=64, skip_layers=(0,))


def test_a_crossing_needs_patience_steps_in_a_row():
    settings = ControlSettings(target=0.86, tolerance=0.01, patience=2)
    history = {1: {0: 0.99, 1: 0.84}, 2: {0: 0.99, 1: 0.84}, 3: {0: 0.99, 1: 0.90}}
    assert decide(history, 1, SCHEDULE, settings).raise_bins == ()  # one step only
    assert decide(history, 2, SCHEDULE, settings).raise_bins == (1,)
    assert decide(history, 3, SCHEDULE, settings).raise_bins == ()  # recovered


def test_tolerance_keeps_a_near_miss_from_counting():
    history = {1: {0: 0.855}}
    assert decide(history, 1, SCHEDULE, ControlSettings(tolerance=0.01)).raise_bins == ()
    assert decide(history, 1, SCHEDULE, ControlSettings(tolerance=0.0)).raise_bins == (0,)


def test_lowering_only_when_due_and_above_target_plus_margin():
    settings = ControlSettings(target=0.86, margin=0.05)
    history = {4: {0: 0.95, 1: 0.90, 2: 0.80}}
    assert decide(history, 4, SCHEDULE, settings).lower_bins == ()
    decision = decide(history, 4, SCHEDULE, settings, lowering_due=True)
    assert decision.lower_bins == (0,) and decision.raise_bins == (2,)
    assert len(decision.reasons) == 2


def test_bins_past_the_schedule_count_as_its_last():
    decision = decide({1: {3: 0.99, 5: 0.5}}, 1, SCHEDULE, ControlSettings())
    assert decision.raise_bins == (3,)


def test_raise_takes_the_smallest_larger_budget_meeting_target_and_lifts_later_bins():
    settings = ControlSettings(target=0.86)
    decision = Decision(step=2, raise_bins=(1,))
    topk_pages = candidate_topk_pages(SCHEDULE, 1, [2, 4, 6, 8, 12, 16], "raise")
    assert topk_pages == [8, 12, 16]
    p5 = np.full((3, 4), np.nan)
    p5[:, 1] = [0.80, 0.90, 0.95]
    new, changes = apply_measurement(SCHEDULE, decision, topk_pages, p5, settings)
    assert new.topk_pages == (4, 12, 12, 12)
    assert [(c.bin, c.kind, c.old_topk, c.new_topk) for c in changes] == [
        (1, "raise", 6, 12),
        (2, "follow", 8, 12),
        (3, "follow", 8, 12),
    ]
    assert changes[0].p5 == pytest.approx(0.90) and math.isnan(changes[1].p5)


def test_raise_with_no_budget_meeting_target_takes_the_largest_measured():
    p5 = np.array([[np.nan, 0.5, np.nan, np.nan], [np.nan, 0.6, np.nan, np.nan]])
    new, _ = apply_measurement(
        SCHEDULE, Decision(1, raise_bins=(1,)), [8, 12], p5, ControlSettings()
    )
    assert new.topk_pages == (4, 12, 12, 12)


def test_lower_takes_the_smallest_budget_meeting_target_but_never_below_the_bin_before():
    settings = ControlSettings(target=0.86)
    decision = Decision(step=5, lower_bins=(0, 2))
    topk_pages = [1, 2, 3, 4, 6]
    p5 = np.full((5, 4), np.nan)
    p5[:, 0] = [0.2, 0.87, 0.9, 0.95, 0.99]  # bin 0: 4 -> 2
    p5[:, 2] = [0.5, 0.6, 0.7, 0.88, 0.99]  # bin 2: 8 -> 4, then up to bin 1's 6
    new, changes = apply_measurement(SCHEDULE, decision, topk_pages, p5, settings)
    assert new.topk_pages == (2, 6, 6, 8)
    assert [(c.bin, c.kind, c.new_topk) for c in changes] == [(0, "lower", 2), (2, "lower", 6)]


def test_nothing_meets_target_lower_leaves_the_bin():
    p5 = np.array([[0.5, np.nan, np.nan, np.nan]])
    new, changes = apply_measurement(
        SCHEDULE, Decision(1, lower_bins=(0,)), [2], p5, ControlSettings()
    )
    assert new == SCHEDULE and changes == []


@pytest.mark.parametrize(
    "kwargs", [dict(target=0.0), dict(patience=0), dict(margin=1.0), dict(tolerance=-0.1)]
)
def test_bad_settings_are_one_clear_error(kwargs):
    with pytest.raises(ControllerError):
        ControlSettings(**kwargs)


def test_budgets_on_the_wrong_side_of_the_current_one_are_ignored():
    # bin 1 (6 pages) is raised: 4 pages measured well but is not a raise
    p5 = np.array([[np.nan, 0.99, np.nan, np.nan], [np.nan, 0.9, np.nan, np.nan]])
    new, _ = apply_measurement(
        SCHEDULE, Decision(1, raise_bins=(1,)), [4, 8], p5, ControlSettings()
    )
    assert new.topk_pages == (4, 8, 8, 8)


def test_bins_without_tokens_follow_a_lowered_bin_down():
    schedule = Schedule("s", (8, 8, 8, 8), page_size=8, bin_tokens=64, skip_layers=(0,))
    p5 = np.full((2, 4), np.nan)
    p5[:, 2] = [0.9, 0.99]
    decision = Decision(3, lower_bins=(2,))
    new, changes = apply_measurement(
        schedule, decision, [2, 4], p5, ControlSettings(), tokens=[0, 0, 80, 40]
    )
    assert new.topk_pages == (2, 2, 2, 8)
    assert [c.kind for c in changes] == ["follow", "follow", "lower"]
    # with tokens in bin 1 it blocks: the lowered bin stops at bin 1's budget
    blocked, _ = apply_measurement(
        schedule, decision, [2, 4], p5, ControlSettings(), tokens=[0, 30, 80, 40]
    )
    assert blocked.topk_pages == (8, 8, 8, 8)


def test_a_raise_the_exact_value_at_the_current_budget_meets_is_dropped_with_its_reason():
    decision = Decision(3, raise_bins=(0, 1, 2, 3), reasons=("trigger",))
    # bin 0 meets at its 4 pages, bin 1 misses at its 6, bin 2 had no token, bin 3 absent
    out = confirm_raises(decision, SCHEDULE, {0: 0.95, 1: 0.5, 2: math.nan}, target=0.86)
    assert out.raise_bins == (1,) and out.step == 3 and out.lower_bins == ()
    assert out.reasons[0] == "trigger"
    assert "bin 0: exact 0.9500 >= 0.8600 at its 4 pages; no raise" in out.reasons
    assert any(r.startswith("bin 2: no token") for r in out.reasons)
    assert any(r.startswith("bin 3: no token") for r in out.reasons)
    # exactly at the target meets it, as apply_measurement counts meeting
    assert confirm_raises(Decision(3, raise_bins=(1,)), SCHEDULE, {1: 0.86}, 0.86).raise_bins == ()
    # lowers are left alone
    both = Decision(3, raise_bins=(1,), lower_bins=(0,))
    assert confirm_raises(both, SCHEDULE, {1: 0.99}, 0.86).lower_bins == (0,)
