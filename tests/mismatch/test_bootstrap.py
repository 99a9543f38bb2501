"""Cluster bootstrap: the vectorised replicates equal a plain loop that concatenates the drawn
trajectories, and the intervals behave as intervals (contain the estimate, widen with fewer
trajectories, resample trajectories rather than tokens)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparrow.mismatch import bootstrap
from sparrow.mismatch.bootstrap import (
    STATISTICS,
    bootstrap_intervals,
    draw_clusters,
    paired_difference_intervals,
    replicate_statistics,
)


def _bin(num_clusters=12, seed=0):
    """Trajectories of uneven length, each with its own level of acceptance (correlated)."""
    rng = np.random.default_rng(seed)
    values, clusters = [], []
    for k in range(num_clusters):
        n = int(rng.integers(3, 40))
        level = rng.uniform(0.3, 1.0)
        values.append(np.clip(level + 0.2 * rng.standard_normal(n), 0.0, 1.0))
        clusters += [k] * n
    return np.concatenate(values), np.array(clusters)


def _loop(values, clusters, draws):
    out = {name: [] for name in STATISTICS}
    for row in draws:
        sample = np.concatenate([values[clusters == k] for k in row])
        out["mean"].append(sample.mean())
        out["min"].append(sample.min())
        out["share_below_half"].append(np.mean(sample < 0.5))
        for name, q in bootstrap.PERCENTILE_OF.items():
            out[name].append(np.percentile(sample, q))
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("block", [512, 7, 1])  # one block, many with a short last one, tokens
def test_vectorised_replicates_equal_a_plain_loop(monkeypatch, block):
    monkeypatch.setattr(bootstrap, "BLOCK_TOKENS", block)
    values, clusters = _bin()
    draws = draw_clusters(12, 64, seed=3)
    fast = replicate_statistics(values, clusters, draws)
    slow = _loop(values, clusters, draws)
    for name in STATISTICS:
        np.testing.assert_allclose(fast[name], slow[name], rtol=0, atol=1e-12, err_msg=name)


def test_intervals_hold_the_estimate_and_are_seeded():
    values, clusters = _bin(num_clusters=30)
    intervals = bootstrap_intervals(values, clusters, resamples=300, seed=1)
    assert intervals == bootstrap_intervals(values, clusters, resamples=300, seed=1)
    assert intervals != bootstrap_intervals(values, clusters, resamples=300, seed=2)
    for name, q in bootstrap.PERCENTILE_OF.items():
        low, high = intervals[name]
        assert low <= np.percentile(values, q) <= high, name
    low, high = intervals["mean"]
    assert low < values.mean() < high and high - low > 0.02


def test_resampling_trajectories_is_wider_than_resampling_tokens():
    # correlated tokens: treating each token as its own trajectory under-states the spread
    values, clusters = _bin(num_clusters=20, seed=4)
    by_trajectory = bootstrap_intervals(values, clusters, resamples=400, seed=0)["mean"]
    by_token = bootstrap_intervals(values, np.arange(values.size), resamples=400, seed=0)["mean"]
    assert by_trajectory[1] - by_trajectory[0] > 1.5 * (by_token[1] - by_token[0])


def test_one_trajectory_gives_no_interval():
    intervals = bootstrap_intervals([0.5, 0.9, 1.0], [7, 7, 7])
    assert all(math.isnan(low) and math.isnan(high) for low, high in intervals.values())


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="clusters"):
        bootstrap_intervals([0.5, 0.9], [1])
    with pytest.raises(ValueError, match="level"):
        bootstrap_intervals([0.5, 0.9], [1, 2], level=1.5)


def test_paired_differences_equal_a_plain_loop_on_the_same_draws():
    before, clusters = _bin(num_clusters=15, seed=4)
    rng = np.random.default_rng(5)
    after = np.clip(before + 0.05 * rng.standard_normal(before.size), 0.0, 1.0)
    out = paired_difference_intervals(before, after, clusters, resamples=100, seed=7)
    draws = draw_clusters(15, 100, seed=7)
    first, second = _loop(before, clusters, draws), _loop(after, clusters, draws)
    whole = _loop(before, clusters, [np.arange(15)]), _loop(after, clusters, [np.arange(15)])
    for name in STATISTICS:
        delta, low, high = out[name]
        assert delta == pytest.approx(whole[1][name][0] - whole[0][name][0], abs=1e-12)
        expect = np.percentile(second[name] - first[name], [2.5, 97.5])
        assert (low, high) == pytest.approx(tuple(expect), abs=1e-12), name


def test_a_shift_of_every_token_is_that_shift_with_no_width():
    before, clusters = _bin(num_clusters=10, seed=6)
    before = 0.1 + 0.7 * before  # in [0.1, 0.8]: the shift stays inside [0, 1]
    same = paired_difference_intervals(before, before, clusters, resamples=50)
    assert all(v == (0.0, 0.0, 0.0) for v in same.values())
    shifted = paired_difference_intervals(before, before + 0.1, clusters, resamples=50)
    for name in ("mean", "p1", "p5", "p10", "p50", "min"):
        assert shifted[name] == pytest.approx((0.1, 0.1, 0.1), abs=1e-12), name


def test_pairing_cancels_what_the_two_measurements_share():
    before, clusters = _bin(num_clusters=40, seed=8)  # trajectories of very different levels
    rng = np.random.default_rng(9)
    after = np.clip(before + 0.02 + 0.01 * rng.standard_normal(before.size), 0.0, 1.0)
    _, low, high = paired_difference_intervals(before, after, clusters, resamples=300)["mean"]
    alone = bootstrap_intervals(before, clusters, resamples=300)["mean"]
    assert 0.0 < low < high and high - low < (alone[1] - alone[0]) / 5


def test_paired_inputs_of_other_lengths_are_one_error():
    with pytest.raises(ValueError, match="same tokens: 3, 2, 3"):
        paired_difference_intervals([0.5, 0.6, 0.7], [0.5, 0.6], [0, 1, 1])
    single = paired_difference_intervals([0.5, 0.6], [0.6, 0.7], [0, 0])
    assert single["mean"][0] == pytest.approx(0.1) and math.isnan(single["mean"][1])
