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


@pytest.mark.parametrize("chunk", [1 << 22, 50])  # one chunk, and many small ones
def test_vectorised_replicates_equal_a_plain_loop(monkeypatch, chunk):
    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", chunk)
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
