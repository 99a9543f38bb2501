"""Per-bin statistics and tail summaries, checked against numpy on masks and hand formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparrow.mismatch import bootstrap
from sparrow.mismatch.acceptance import (
    BinFloor,
    BinStats,
    MismatchError,
    bin_statistics,
    bins_below,
    fit_beta_tail,
    min_p5,
)


def _linear_percentile(values: np.ndarray, q: float) -> float:
    """numpy's default percentile, written out: interpolate between order statistics."""
    ordered = np.sort(values)
    h = (len(ordered) - 1) * q / 100.0
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (h - low) * (ordered[high] - ordered[low]))


def _tokens(n=6000, seed=0, max_position=9000):
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, max_position, n)
    tail = rng.random(n) < 0.3 + positions / 30000  # more tail tokens further out
    acceptance = np.where(tail, 0.999 * rng.beta(2.0, 1.2, n), 1.0 - 1e-4 * rng.random(n))
    return positions, acceptance


def test_per_bin_values_match_numpy_on_masks():
    positions, acceptance = _tokens()
    stats = bin_statistics(positions, acceptance)
    assert [s.bin for s in stats] == [0, 1, 2, 3, 4]
    for s in stats:
        values = acceptance[positions // 2000 == s.bin]
        assert s.n == values.size
        assert s.mean == pytest.approx(values.mean(), abs=1e-12)
        assert s.tail_n == int((values < 0.999).sum())
        assert s.p5 == pytest.approx(_linear_percentile(values, 5), abs=1e-12)
        for name, q in (("p1", 1), ("p5", 5), ("p10", 10), ("p50", 50)):
            assert getattr(s, name) == pytest.approx(
                np.percentile(values, q, method="linear"), abs=1e-12
            )
        fit = fit_beta_tail(values)
        assert (s.beta_a, s.beta_b, s.beta_var, s.ks) == (fit.a, fit.b, fit.var, fit.ks)


def test_empty_bins_are_skipped_and_num_bins_clamps():
    rng = np.random.default_rng(1)
    positions = np.concatenate(
        [rng.integers(0, 2000, 50), rng.integers(6000, 7000, 40), [50000, 90000]]
    )
    acceptance = rng.random(positions.size)
    assert [(s.bin, s.n) for s in bin_statistics(positions, acceptance)] == [
        (0, 50),
        (3, 40),
        (25, 1),
        (45, 1),
    ]
    clamped = bin_statistics(positions, acceptance, num_bins=4)
    assert [(s.bin, s.n) for s in clamped] == [(0, 50), (3, 42)]
    values = acceptance[positions >= 6000]
    assert clamped[1].p5 == pytest.approx(_linear_percentile(values, 5), abs=1e-12)
    coarse = bin_statistics(positions, acceptance, bin_tokens=100000)
    assert [(s.bin, s.n) for s in coarse] == [(0, positions.size)]


def test_small_bin_has_nan_fit_not_an_error():
    positions = np.array([10, 20, 30, 4000, 4001])
    acceptance = np.array([0.5, 0.99, 1.0, 0.2, 0.3])
    first, second = bin_statistics(positions, acceptance)
    assert (first.bin, first.n, first.tail_n) == (0, 3, 2)
    assert math.isnan(first.beta_a) and math.isnan(first.beta_var) and math.isnan(first.ks)
    assert first.p50 == 0.99 and second.p50 == pytest.approx(0.25)


def test_torch_inputs_equal_numpy_inputs():
    positions, acceptance = _tokens(n=3000, seed=2)
    from_numpy = bin_statistics(positions, acceptance)
    from_torch = bin_statistics(torch.from_numpy(positions), torch.from_numpy(acceptance))
    assert from_torch == from_numpy
    assert bin_statistics(np.array([], dtype=np.int64), np.array([])) == []


def test_bad_acceptance_names_count_first_row_and_value():
    positions = np.arange(6)
    acceptance = np.array([0.5, 0.9, 1.5, np.nan, 0.2, -0.1])
    with pytest.raises(MismatchError, match=r"acceptance .*3 bad rows, first at row 2: 1\.5"):
        bin_statistics(positions, acceptance)
    with pytest.raises(
        MismatchError, match=r"positions has shape \(6,\) but acceptance has \(5,\)"
    ):
        bin_statistics(positions, acceptance[:5])
    with pytest.raises(MismatchError, match="position must be >= 0"):
        bin_statistics(np.array([0, -2]), np.array([0.5, 0.5]))


def _stats(p5_by_bin: dict[int, float]) -> list[BinStats]:
    nan = float("nan")
    return [
        BinStats(
            bin=b,
            n=100,
            mean=0.99,
            p1=p5 / 2,
            p5=p5,
            p10=p5,
            p50=1.0,
            beta_a=nan,
            beta_b=nan,
            beta_var=nan,
            ks=nan,
            tail_n=10,
        )
        for b, p5 in p5_by_bin.items()
    ]


def test_tail_summaries():
    stats = _stats({0: 0.95, 1: 0.86, 2: 0.859, 4: 0.70, 5: 0.91})
    assert min_p5(stats) == 0.70
    assert bins_below(stats, 0.86) == [2, 4]
    assert bins_below(stats, 0.0) == []
    assert bins_below(stats, 1.0) == [0, 1, 2, 4, 5]
    with pytest.raises(MismatchError, match="at least one bin"):
        min_p5([])
    with pytest.raises(MismatchError, match="target"):
        bins_below(stats, 86)


def test_bin_stats_checks_its_invariants():
    (good,) = _stats({3: 0.9})
    with pytest.raises(MismatchError, match="p1 <= p5 <= p10 <= p50"):
        BinStats.from_row({**good.as_dict(), "p10": 0.5})
    with pytest.raises(MismatchError, match="tail_n"):
        BinStats.from_row({**good.as_dict(), "tail_n": 101})
    with pytest.raises(MismatchError, match="min must lie in"):
        BinStats.from_row({**good.as_dict(), "min": good.p1 + 0.01})
    with pytest.raises(MismatchError, match="share_below_half in"):
        BinStats.from_row({**good.as_dict(), "share_below_half": 1.5})
    assert list(good.as_dict()) == [
        "bin",
        "n",
        "mean",
        "p1",
        "p5",
        "p10",
        "p50",
        "beta_a",
        "beta_b",
        "beta_var",
        "ks",
        "tail_n",
        "min",
        "share_below_half",
        "samples",
        "counted",
        *(f"{name}_{side}" for name in bootstrap.STATISTICS for side in ("lo", "hi")),
    ]
    assert BinStats.from_row(good.as_dict()) == good
    # rows built without the two newer statistics still validate (NaN: not computed)
    assert math.isnan(good.min) and math.isnan(good.share_below_half)


def test_min_and_share_below_half_against_a_plain_loop():
    # known values: bin 0 holds 0.2, 0.5, 0.9, 1.0; bin 1 holds 0.49999, 0.7; bin 3 holds 0.1
    positions = np.array([0, 3, 5, 9, 10, 15, 31])
    acceptance = np.array([0.9, 0.2, 1.0, 0.5, 0.49999, 0.7, 0.1])
    stats = {s.bin: s for s in bin_statistics(positions, acceptance, bin_tokens=10)}
    assert sorted(stats) == [0, 1, 3]
    for b, s in stats.items():
        lowest, below, count = math.inf, 0, 0
        for position, value in zip(positions, acceptance):
            if position // 10 == b:
                lowest = min(lowest, value)
                below += value < 0.5
                count += 1
        assert s.min == lowest and s.share_below_half == below / count
    assert (stats[0].min, stats[0].share_below_half) == (0.2, 0.25)  # 0.5 itself is not below
    assert (stats[1].min, stats[1].share_below_half) == (0.49999, 0.5)
    assert (stats[3].min, stats[3].share_below_half) == (0.1, 1.0)
    # on the larger sample too
    positions, acceptance = _tokens(seed=3)
    for s in bin_statistics(positions, acceptance):
        values = [v for p, v in zip(positions, acceptance) if p // 2000 == s.bin]
        assert s.min == min(values)
        assert s.share_below_half == sum(v < 0.5 for v in values) / len(values)


def test_intervals_are_the_bins_cluster_bootstrap_and_round_trip():
    positions, acceptance = _tokens(n=3000)
    samples = np.arange(3000) // 25  # 120 trajectories of 25 tokens, spread over the bins
    stats = bin_statistics(positions, acceptance, samples=samples, seed=5)
    for s in stats:
        in_bin = positions // 2000 == s.bin
        assert s.samples == np.unique(samples[in_bin]).size
        expected = bootstrap.bootstrap_intervals(
            acceptance[in_bin], samples[in_bin], seed=(5, s.bin)
        )
        assert s.intervals == expected
        low, high = s.intervals["p5"]
        assert low <= s.p5 <= high
        row = s.as_dict()
        assert (row["p5_lo"], row["p5_hi"]) == (low, high)
        assert BinStats.from_row(row).intervals == s.intervals
    assert all(not s.intervals for s in bin_statistics(positions, acceptance))


def test_bins_below_the_floor_are_kept_but_not_counted():
    # bin 0: 600 tokens of 10 trajectories; bin 1: 600 tokens of 3; bin 2: 40 tokens of 10
    positions = np.concatenate([np.full(600, 10), np.full(600, 2010), np.full(40, 4010)])
    samples = np.concatenate([np.arange(600) % 10, np.arange(600) % 3, np.arange(40) % 10])
    acceptance = np.concatenate([np.full(600, 0.95), np.full(600, 0.2), np.full(40, 0.1)])
    stats = bin_statistics(positions, acceptance, samples=samples, floor=BinFloor(500, 8))
    assert [(s.bin, s.counted) for s in stats] == [(0, True), (1, False), (2, False)]
    assert min_p5(stats) == pytest.approx(0.95)  # the thin bins are not the worst
    assert bins_below(stats, 0.86) == []
    assert bins_below(bin_statistics(positions, acceptance), 0.86) == [1, 2]  # no floor
    assert math.isnan(min_p5(stats[1:]))
    # without trajectory ids only the token count decides
    assert [s.counted for s in bin_statistics(positions, acceptance, floor=BinFloor(500, 8))] == [
        True,
        True,
        False,
    ]
