"""The DistillSparse switch rule (controller.distill_switch): a cheaper schedule is taken only
after `patience` measurements in a row, all of the schedule in force and of one candidate,
held every measured bin at target + margin; one_notch_cheaper lowers each bin one grid budget."""

import math

import pytest

from sparrow.control.controller import (
    CheaperMeasurement,
    ControllerError,
    ControlSettings,
    distill_switch,
    one_notch_cheaper,
)
from sparrow.sparse.schedule import Schedule

SCHEDULE = Schedule("s", (4, 8, 16, 16), page_size=8, bin_tokens=64)
GRID = (2, 4, 6, 8, 12, 16)
CHEAPER = (2, 6, 12, 12)
SETTINGS = ControlSettings(target=0.86)


def measured(step, values, schedule_topk=SCHEDULE.topk_pages, cheaper=CHEAPER):
    return CheaperMeasurement(step, tuple(schedule_topk), tuple(cheaper), values)


def test_one_notch_cheaper_takes_the_next_grid_budget_down_per_bin():
    assert one_notch_cheaper(SCHEDULE, GRID).topk_pages == CHEAPER
    # nothing below a bin's budget: it stays, and later bins never fall under it
    assert one_notch_cheaper(
        Schedule("t", (1, 3, 5), page_size=8, bin_tokens=64), (4,)
    ).topk_pages == (1, 3, 4)
    assert one_notch_cheaper(SCHEDULE, ()).topk_pages == SCHEDULE.topk_pages


def test_switch_after_patience_steps_at_target():
    good = {0: 0.95, 1: 0.88, 2: 0.9, 3: 0.87}
    history = [measured(3, good), measured(4, {**good, 1: 0.861})]
    new, changes = distill_switch(history, SCHEDULE, SETTINGS, patience=2)
    assert new.topk_pages == CHEAPER and new.name == SCHEDULE.name
    assert [(c.bin, c.kind, c.old_topk, c.new_topk) for c in changes] == [
        (0, "distill", 4, 2),
        (1, "distill", 8, 6),
        (2, "distill", 16, 12),
        (3, "distill", 16, 12),
    ]
    assert changes[1].p5 == pytest.approx(0.861)  # the lowest measured of the bin
    # one measurement is not enough at patience 2; enough at patience 1
    assert distill_switch(history[-1:], SCHEDULE, SETTINGS, patience=2) is None
    assert distill_switch(history[-1:], SCHEDULE, SETTINGS, patience=1)[0].topk_pages == CHEAPER


@pytest.mark.parametrize(
    "case",
    ["below", "margin", "other_schedule", "other_candidate", "older_below", "nothing_measured"],
)
def test_no_switch(case):
    good = {0: 0.95, 1: 0.9, 2: 0.9}
    first, last = measured(5, good), measured(6, good)
    margin = 0.0
    if case == "below":
        last = measured(6, {**good, 2: 0.859})
    elif case == "margin":
        margin = 0.05
    elif case == "other_schedule":  # measured while another schedule was rolled out
        first = measured(5, good, schedule_topk=(4, 8, 12, 16))
    elif case == "other_candidate":
        first = measured(5, good, cheaper=(4, 6, 12, 12))
    elif case == "older_below":
        first = measured(5, {**good, 0: 0.5})
    else:
        last = measured(6, {})
    assert distill_switch([first, last], SCHEDULE, SETTINGS, 2, margin) is None


def test_only_the_last_patience_measurements_count_and_late_bins_clamp():
    # bin 9 is past the schedule's last bin: it counts in bin 3
    history = [measured(1, {0: 0.1}), measured(7, {0: 0.9, 9: 0.87}), measured(8, {0: 0.9})]
    new, changes = distill_switch(history, SCHEDULE, SETTINGS, patience=2)
    assert new.topk_pages == CHEAPER
    assert changes[3].p5 == pytest.approx(0.87) and math.isnan(changes[1].p5)
    late_below = [measured(7, {0: 0.9, 9: 0.8}), measured(8, {0: 0.9})]
    assert distill_switch(late_below, SCHEDULE, SETTINGS, patience=2) is None


def test_no_switch_when_the_candidate_is_the_schedule_and_bad_patience_is_refused():
    same = [measured(1, {0: 0.99}, cheaper=SCHEDULE.topk_pages)]
    assert distill_switch(same, SCHEDULE, SETTINGS, patience=1) is None
    with pytest.raises(ControllerError, match="patience"):
        distill_switch([], SCHEDULE, SETTINGS, patience=0)
