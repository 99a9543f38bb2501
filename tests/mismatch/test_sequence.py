"""Per-trajectory statistics and the effective sample size, against hand formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparrow.mismatch.fit import MismatchError
from sparrow.mismatch.sequence import effective_sample_size, sequence_statistics


def test_sequence_statistics_by_hand():
    stats = sequence_statistics(
        [1.0, 0.5, 0.8], [-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5], lookup=[False, True, True]
    )
    assert stats.tokens == 3
    assert stats.mismatch_sum == pytest.approx(0.7)
    assert stats.min_acceptance == 0.5
    assert stats.log_weight == pytest.approx(0.5 - 1.0 + 0.0)
    assert stats.lookup_tokens == 2 and stats.lookup_mismatch_sum == pytest.approx(0.7)
    unknown = sequence_statistics([0.9], [0.0], [0.0])
    assert unknown.lookup_tokens is None and unknown.lookup_mismatch_sum is None
    empty = sequence_statistics([], [], [])
    assert empty.tokens == 0 and empty.mismatch_sum == 0 and math.isnan(empty.min_acceptance)


def test_mismatched_lengths_are_refused():
    with pytest.raises(MismatchError, match="differ in length"):
        sequence_statistics([0.9, 0.8], [0.0], [0.0, 0.0])
    with pytest.raises(MismatchError, match="lookup mask"):
        sequence_statistics([0.9], [0.0], [0.0], lookup=[True, False])


def test_effective_sample_size():
    assert effective_sample_size([0.3, 0.3, 0.3, 0.3]) == pytest.approx(1.0)
    assert effective_sample_size([0.0, -800.0, -800.0, -800.0]) == pytest.approx(0.25)
    weights = np.array([1.0, 2.0, 3.0])
    expected = weights.sum() ** 2 / (3 * (weights**2).sum())
    assert effective_sample_size(np.log(weights) + 900.0) == pytest.approx(expected)  # no overflow
    assert math.isnan(effective_sample_size([]))
