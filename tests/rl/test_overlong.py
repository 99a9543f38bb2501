"""DAPO's soft overlong penalty and the truncated-sample mask, each against a plain loop.

python -m pytest tests/rl/test_overlong.py -q
"""

from __future__ import annotations

import pytest
import torch

from sparrow.rl.checks import RLInputError
from sparrow.rl.overlong import kept_samples, overlong_penalties


def penalty_loop(length: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO eq. 13 written out, one sample at a time."""
    if buffer == 0:
        return 0.0
    expected_len = max_new_tokens - buffer
    if length <= expected_len:
        return 0.0
    if length <= max_new_tokens:
        return (expected_len - length) / buffer * penalty
    return -1.0 * penalty


@pytest.mark.parametrize(
    "max_new_tokens, buffer, penalty", [(16, 4, 1.0), (16, 0, 1.0), (9, 9, 0.5)]
)
def test_the_penalty_matches_a_plain_loop(max_new_tokens, buffer, penalty):
    lengths = list(range(0, max_new_tokens + 3))
    got = overlong_penalties(lengths, max_new_tokens, buffer, penalty)
    expected = [penalty_loop(n, max_new_tokens, buffer, penalty) for n in lengths]
    assert got.tolist() == pytest.approx(expected)
    assert got.dtype == torch.float64


def test_the_ramp_values():
    # budget 16, buffer 4: free up to 12 tokens, then -0.25 per token down to -1 at 16
    got = overlong_penalties([12, 13, 14, 16, 17], 16, 4, 2.0)
    assert got.tolist() == [0.0, -0.5, -1.0, -2.0, -2.0]


def test_bad_arguments():
    with pytest.raises(RLInputError, match="buffer <= max_new_tokens"):
        overlong_penalties([1], 4, 5)
    with pytest.raises(RLInputError, match="penalty must be >= 0"):
        overlong_penalties([1], 4, 2, -1.0)


def test_truncated_samples_leave_the_loss_only_when_asked():
    reasons = ["stop", "length", "stop", "length"]
    assert kept_samples(reasons, True).tolist() == [r != "length" for r in reasons]
    assert kept_samples(reasons, False).tolist() == [True] * 4
