"""The Beta tail fit: recovery of known parameters, the MLE property, the KS statistic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from sparrow.mismatch.acceptance import BetaFit, MismatchError, fit_beta_tail


def _standard_errors(a: float, b: float, n: int) -> tuple[float, float]:
    """Asymptotic MLE standard errors of (a, b) from the Beta Fisher information."""
    both = special.polygamma(1, a + b)
    info = np.array(
        [[special.polygamma(1, a) - both, -both], [-both, special.polygamma(1, b) - both]]
    )
    cov = np.linalg.inv(info) / n
    return math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])


def _log_likelihood(x: np.ndarray, a: float, b: float) -> float:
    return float(stats.beta.logpdf(x, a, b).sum())


@pytest.mark.parametrize("a,b,seed", [(2.0, 5.0, 0), (0.8, 0.6, 1), (3.0, 1.2, 2)])
def test_recovers_known_beta_within_four_standard_errors(a, b, seed):
    n = 4000
    rng = np.random.default_rng(seed)
    sample = 0.999 * rng.beta(a, b, n)
    fit = fit_beta_tail(sample)
    se_a, se_b = _standard_errors(a, b, n)
    assert fit.n == n
    assert abs(fit.a - a) < 4 * se_a
    assert abs(fit.b - b) < 4 * se_b
    assert fit.var == pytest.approx(stats.beta(fit.a, fit.b).var(), rel=1e-10)
    # a true Beta passes KS at the 1% level (1.63 / sqrt(n)), fitted parameters only help
    assert fit.ks < 1.63 / math.sqrt(n)


def test_fit_maximises_the_likelihood_and_ks_is_the_sup_distance():
    rng = np.random.default_rng(3)
    sample = 0.999 * rng.beta(1.5, 2.5, 2000)
    fit = fit_beta_tail(sample)
    x = np.sort(sample / 0.999)
    best = _log_likelihood(x, fit.a, fit.b)
    for da, db in ((1.03, 1.0), (0.97, 1.0), (1.0, 1.03), (1.0, 0.97), (1.03, 1.03)):
        assert _log_likelihood(x, fit.a * da, fit.b * db) < best
    cdf = stats.beta.cdf(x, fit.a, fit.b)
    i = np.arange(1, x.size + 1)
    ks = max((i / x.size - cdf).max(), (cdf - (i - 1) / x.size).max())
    assert fit.ks == pytest.approx(ks, abs=1e-12)


def test_ks_is_large_for_a_sample_no_beta_fits():
    rng = np.random.default_rng(4)
    clusters = np.concatenate([0.2 + 0.01 * rng.random(1000), 0.8 + 0.01 * rng.random(1000)])
    assert fit_beta_tail(clusters).ks > 0.15


def test_values_at_or_above_threshold_are_left_out():
    rng = np.random.default_rng(5)
    tail = 0.999 * rng.beta(2.0, 3.0, 500)
    with_heads = np.concatenate([tail, np.full(3000, 1.0), np.full(200, 0.999)])
    plain, mixed = fit_beta_tail(tail), fit_beta_tail(with_heads)
    assert mixed.n == 500
    assert (mixed.a, mixed.b, mixed.ks) == (plain.a, plain.b, plain.ks)


def test_threshold_sets_the_scale():
    rng = np.random.default_rng(6)
    n = 3000
    sample = 0.5 * rng.beta(2.0, 3.0, n)
    fit = fit_beta_tail(np.concatenate([sample, np.full(100, 0.7)]), threshold=0.5)
    se_a, se_b = _standard_errors(2.0, 3.0, n)
    assert fit.n == n
    assert abs(fit.a - 2.0) < 4 * se_a and abs(fit.b - 3.0) < 4 * se_b


def test_too_small_or_degenerate_tail_is_nan_with_its_count():
    few = fit_beta_tail(np.array([0.3] * 5 + [0.4] * 5 + [1.0] * 100))
    assert few.n == 10 and not few.fitted and math.isnan(few.var)
    same = fit_beta_tail(np.full(50, 0.5))
    assert same.n == 50 and not same.fitted
    none = fit_beta_tail(np.ones(10))
    assert none.n == 0 and math.isnan(none.ks)
    # exact zeros (disjoint supports) are clipped, not fatal
    zeros = fit_beta_tail(
        np.concatenate([np.zeros(10), np.random.default_rng(7).random(100) * 0.9])
    )
    assert zeros.fitted and zeros.n == 110


def test_errors_and_invariants():
    with pytest.raises(
        MismatchError, match=r"acceptance must be in \[0, 1\].*first at row 1: 1\.2"
    ):
        fit_beta_tail(np.array([0.5, 1.2]))
    with pytest.raises(MismatchError, match="threshold"):
        fit_beta_tail(np.array([0.5]), threshold=0.0)
    with pytest.raises(MismatchError, match="a > 0 and b > 0"):
        BetaFit(a=-1.0, b=1.0, var=0.1, ks=0.1, n=5)
    with pytest.raises(MismatchError, match="var"):
        BetaFit(a=1.0, b=1.0, var=0.3, ks=0.1, n=5)
