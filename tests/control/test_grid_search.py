"""Budget search: on a monotone statistic it picks what measuring every candidate picks, with
fewer budgets; on a non-monotone one its pick meets the target and is never smaller."""

from __future__ import annotations

import numpy as np
import pytest

from sparrow.control.controller import (
    ControlSettings,
    Decision,
    apply_measurement,
    candidate_topk_pages,
)
from sparrow.control.grid_search import search_topk_pages
from sparrow.sparse.schedule import Schedule

GRID = (29, 45, 61, 77, 93, 125, 157, 189, 221, 253, 317, 381, 445, 509)
SETTINGS = ControlSettings(target=0.86)


class FakeMeasure:
    """statistic[budget, bin] from a table over GRID; counts budgets and replays."""

    def __init__(self, table: np.ndarray) -> None:
        self.table, self.topk_pages, self.calls = table, [], 0

    def __call__(self, topk_pages):
        self.calls += 1
        self.topk_pages += topk_pages
        return self.table[[GRID.index(b) for b in topk_pages]]


def exhaustive(schedule, decision, table):
    topk_pages = sorted(
        {
            b
            for kind, bins in (("raise", decision.raise_bins), ("lower", decision.lower_bins))
            for bin_ in bins
            for b in candidate_topk_pages(schedule, bin_, GRID, kind)
        }
    )
    rows = table[[GRID.index(b) for b in topk_pages]].reshape(len(topk_pages), table.shape[1])
    return apply_measurement(schedule, decision, topk_pages, rows, SETTINGS)


def searched(schedule, decision, table):
    measure = FakeMeasure(table)
    topk_pages, rows = search_topk_pages(schedule, decision, GRID, measure, SETTINGS.target)
    assert topk_pages == sorted(set(measure.topk_pages)) and len(measure.topk_pages) == len(
        topk_pages
    )
    return apply_measurement(schedule, decision, topk_pages, rows, SETTINGS), measure


def case(rng, monotone: bool):
    bins = 6
    topk = tuple(sorted(rng.choice(GRID, bins)))
    schedule = Schedule("s", topk, page_size=16, bin_tokens=1024)
    if monotone:
        table = np.sort(rng.uniform(0.5, 1.0, (len(GRID), bins)), axis=0)
    else:
        table = rng.uniform(0.5, 1.0, (len(GRID), bins))
    chosen = rng.permutation(bins)[: rng.integers(1, bins + 1)]
    raise_bins = tuple(sorted(b for b in chosen if rng.random() < 0.5))
    lower_bins = tuple(sorted(set(chosen) - set(raise_bins)))
    return schedule, Decision(1, raise_bins, lower_bins), table


@pytest.mark.parametrize("seed", range(200))
def test_monotone_statistic_picks_what_measuring_everything_picks(seed):
    schedule, decision, table = case(np.random.default_rng(seed), monotone=True)
    (new, changes), _ = searched(schedule, decision, table)
    want, want_changes = exhaustive(schedule, decision, table)
    assert new.topk_pages == want.topk_pages and changes == want_changes


@pytest.mark.parametrize("seed", range(200))
def test_non_monotone_pick_meets_target_and_is_never_smaller(seed):
    schedule, decision, table = case(np.random.default_rng(seed), monotone=False)
    (new, changes), _ = searched(schedule, decision, table)
    want, _ = exhaustive(schedule, decision, table)
    assert all(a >= b for a, b in zip(new.topk_pages, want.topk_pages))
    for change in changes:
        if change.kind == "lower" or (change.kind == "raise" and change.new_topk != GRID[-1]):
            assert change.p5 >= SETTINGS.target


def test_next_notch_meeting_costs_one_budget_and_nothing_meeting_costs_a_gallop():
    schedule = Schedule("s", (29,) * 4, page_size=16, bin_tokens=1024)
    decision = Decision(1, raise_bins=(0, 1, 2, 3))
    table = np.full((len(GRID), 4), 0.9)
    (new, _), measure = searched(schedule, decision, table)
    assert new.topk_pages == (45,) * 4 and measure.topk_pages == [45] and measure.calls == 1
    table[:, 3] = 0.04  # random weights: no budget meets; 13 candidates above 29
    (new, _), measure = searched(schedule, decision, table)
    # probes at candidate indices 0, 2, 6, 12 (the last): 4 budgets, not 13
    assert new.topk_pages == (45, 45, 45, 509) and sorted(measure.topk_pages) == [45, 77, 189, 509]


def test_a_lower_probes_from_the_notch_below_and_an_empty_bin_stays():
    schedule = Schedule("s", (253, 253), page_size=16, bin_tokens=1024)
    table = np.full((len(GRID), 2), 0.99)
    table[: GRID.index(125), 0] = 0.5  # 125 is the smallest meeting budget of bin 0
    table[:, 1] = np.nan  # no generated token in bin 1
    decision = Decision(1, lower_bins=(0, 1))
    (new, changes), measure = searched(schedule, decision, table)
    assert new.topk_pages == (125, 253) and measure.topk_pages[0] == 221
    assert [c.bin for c in changes] == [0]
    assert len(measure.topk_pages) < len(candidate_topk_pages(schedule, 0, GRID, "lower"))


def test_rows_measured_before_the_search_are_probes_it_does_not_measure_again():
    schedule = Schedule("s", (29, 29), page_size=16, bin_tokens=1024)
    table = np.full((len(GRID), 2), 0.9)
    table[: GRID.index(77), :] = 0.5  # 77 is the smallest meeting budget of both bins
    decision = Decision(1, raise_bins=(0, 1))
    known = {29: table[GRID.index(29)], 77: table[GRID.index(77)]}  # e.g. a confirmation
    measure = FakeMeasure(table)
    topk_pages, rows = search_topk_pages(schedule, decision, GRID, measure, 0.86, known)
    assert 77 not in measure.topk_pages and 29 not in measure.topk_pages
    assert topk_pages == sorted(set(measure.topk_pages) | set(known))
    new, _ = apply_measurement(schedule, decision, topk_pages, rows, SETTINGS)
    assert new.topk_pages == exhaustive(schedule, decision, table)[0].topk_pages == (77, 77)
