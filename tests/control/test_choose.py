"""The chooser against a brute-force search over every monotone schedule of small tables."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sparrow.control.choose import (
    ChooseError,
    choose_topk_pages,
    monotone_fit,
    topk_cost_table,
)
from sparrow.costmodel import get_hardware, get_model
from sparrow.costmodel.segments import segment_cost
from sparrow.sparse.presets import get_preset


def pool_adjacent_violators(values):
    """The non-decreasing least-squares fit, written out: merge neighbouring blocks that
    violate the order into their mean until none does."""
    blocks = [[v, 1] for v in values]  # [mean, size]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            (a, n), (b, m) = blocks[i], blocks[i + 1]
            blocks[i : i + 2] = [[(a * n + b * m) / (n + m), n + m]]
            i = max(i - 1, 0)
        else:
            i += 1
    return [mean for mean, size in blocks for _ in range(size)]


def fitted_column(column):
    """The fit of the finite entries; a NaN entry takes the fit of the last one before it."""
    finite = [v for v in column if not np.isnan(v)]
    fit = iter(pool_adjacent_violators(finite))
    out, last = [], np.nan
    for v in column:
        last = next(fit) if not np.isnan(v) else last
        out.append(last)
    return out


def brute_force(topk_pages, p5, tokens, cost, target, min_tokens):
    """Every non-decreasing assignment; the constraint of each bin written out plainly."""
    num_budgets, num_bins = p5.shape
    measured = [i for i in range(num_bins) if tokens[i] >= min_tokens]

    def meets(j, i):
        source = i
        if i not in measured:
            before = [m for m in measured if m < i]
            source = before[-1] if before else min(measured)
        fit = fitted_column(p5[:, source])
        ok = [not np.isnan(v) and v >= target for v in fit]
        if not any(ok):
            return j == num_budgets - 1
        return ok[j]

    best, best_cost = None, np.inf
    for picks in itertools.product(range(num_budgets), repeat=num_bins):
        if list(picks) != sorted(picks) or not all(meets(j, i) for i, j in enumerate(picks)):
            continue
        total = sum(cost[j, i] for i, j in enumerate(picks))
        if total < best_cost - 1e-12:
            best, best_cost = picks, total
    return best, best_cost


@pytest.mark.parametrize("seed", range(40))
def test_chooser_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    num_budgets, num_bins = rng.integers(2, 5), rng.integers(1, 6)
    topk_pages = sorted(rng.choice(np.arange(1, 40), size=num_budgets, replace=False).tolist())
    p5 = rng.uniform(0.6, 1.0, size=(num_budgets, num_bins))
    p5[rng.random(p5.shape) < 0.1] = np.nan
    # costs not monotone in budget on purpose: the search must not assume it
    cost = rng.uniform(0.0, 10.0, size=(num_budgets, num_bins))
    tokens = rng.integers(0, 30, size=num_bins)
    tokens[rng.integers(num_bins)] = 50  # at least one measured bin
    target, min_tokens = 0.8, 10
    choice = choose_topk_pages(topk_pages, p5, tokens, cost, target, min_tokens)
    picks, best_cost = brute_force(topk_pages, p5, tokens, cost, target, min_tokens)
    assert choice.cost == pytest.approx(best_cost)
    assert list(choice.topk_pages) == sorted(choice.topk_pages)


def test_monotone_fit_is_pool_adjacent_violators():
    rng = np.random.default_rng(0)
    table = rng.uniform(0, 1, size=(9, 5))
    table[rng.random(table.shape) < 0.2] = np.nan
    fitted = monotone_fit(table)
    for i in range(table.shape[1]):
        np.testing.assert_allclose(fitted[:, i], fitted_column(table[:, i]), equal_nan=True)
        finite = fitted[:, i][~np.isnan(fitted[:, i])]
        assert list(finite) == sorted(finite)


def test_one_lucky_pass_does_not_win():
    # bin 0 passes by chance at 2 pages, then fails at 4 and 8: the fit pools them below target
    p5 = np.array([[0.90], [0.80], [0.82], [0.95]])
    choice = choose_topk_pages([2, 4, 8, 16], p5, [500], np.ones((4, 1)), 0.86)
    assert choice.topk_pages == (16,)


def test_the_lower_bound_decides_not_the_estimate():
    p5 = np.array([[0.88], [0.90], [0.95]])
    lower = np.array([[0.80], [0.87], [0.93]])  # 2 pages meets on the estimate only
    cost = np.array([[1.0], [2.0], [4.0]])
    assert choose_topk_pages([2, 4, 8], p5, [500], cost, 0.86).topk_pages == (2,)
    choice = choose_topk_pages([2, 4, 8], p5, [500], cost, 0.86, lower=lower)
    assert choice.topk_pages == (4,) and choice.bins[0].fitted == pytest.approx(0.87)


def test_a_bin_with_too_few_trajectories_takes_its_neighbours_decision():
    p5 = np.array([[0.99, 0.5], [0.99, 0.9]])
    choice = choose_topk_pages(
        [4, 8], p5, [600, 600], np.ones((2, 2)), 0.86, 500, samples=[8, 3], min_samples=8
    )
    assert choice.topk_pages == (4, 4) and "below the bin floor" in choice.bins[1].note


def test_hand_worked_table():
    topk_pages = [2, 4, 8]
    # bin 0 meets 0.86 at 2 pages, bin 1 at 4, bin 2 only at 8, bin 3 has too few tokens
    p5 = np.array([[0.90, 0.70, 0.50, 0.99], [0.95, 0.88, 0.80, 0.99], [0.99, 0.93, 0.87, 0.99]])
    cost = np.array([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], [4.0, 4.0, 4.0, 4.0]])
    choice = choose_topk_pages(topk_pages, p5, [500, 500, 500, 3], cost, 0.86, min_tokens=100)
    assert choice.topk_pages == (2, 4, 8, 8)
    assert choice.cost == 1 + 2 + 4 + 4
    assert "takes bin 2's decision" in choice.bins[3].note
    assert choice.bins[1].p5 == pytest.approx(0.88)


def test_monotone_forces_a_dearer_later_bin():
    # bin 1 alone would take 2 pages, but bin 0 needs 8 and the schedule may not fall
    p5 = np.array([[0.5, 0.99], [0.5, 0.99], [0.9, 0.99]])
    choice = choose_topk_pages([2, 4, 8], p5, [100, 100], np.ones((3, 2)), 0.86)
    assert choice.topk_pages == (8, 8)


def test_unreachable_bin_takes_the_largest_budget_and_says_so():
    p5 = np.array([[0.9, 0.1], [0.95, 0.2]])
    choice = choose_topk_pages([4, 8], p5, [100, 100], np.ones((2, 2)), 0.86)
    assert choice.topk_pages == (4, 8)
    assert "no budget" in choice.bins[1].note


def test_leading_thin_bin_takes_the_next_bins_decision():
    p5 = np.array([[0.99, 0.5], [0.99, 0.9]])
    choice = choose_topk_pages([4, 8], p5, [2, 100], np.ones((2, 2)), 0.86, min_tokens=50)
    assert choice.topk_pages == (8, 8)
    assert "takes bin 1's decision" in choice.bins[0].note


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(topk_pages=[4, 4]), "strictly increasing"),
        (dict(tokens=[1, 1]), "min_tokens"),
        (dict(p5=np.ones((3, 2))), "shape"),
        (dict(target=1.5), "target"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, match):
    args = dict(
        topk_pages=[4, 8],
        p5=np.ones((2, 2)),
        tokens=[100, 100],
        cost=np.ones((2, 2)),
        target=0.86,
        min_tokens=10,
    )
    args.update(kwargs)
    with pytest.raises(ChooseError, match=match):
        choose_topk_pages(**args)


def test_cost_table_is_segment_cost_per_bin():
    template = get_preset("qwen3-1.7b-0.86")
    model, hardware = get_model("qwen3-1.7b"), get_hardware("h200")
    table = topk_cost_table([29, 61], 3, template, model=model, hardware=hardware, prompt_len=1000)
    # bin 0 holds generated tokens [0, 1000), bin 2 holds [3000, 5000)
    expected = segment_cost(
        model=model,
        hardware=hardware,
        prompt_len=1000,
        start=3000,
        end=5000,
        samples=1,
        budget_tokens=(61 + 3) * 16,
        page_size=16,
    ).total
    assert table[1, 2] == pytest.approx(expected)
    assert table[0, 0] < table[0, 2] and table[0, 2] < table[1, 2]
