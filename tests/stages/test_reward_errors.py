"""The reward stage's error share: a step where more than data.reward_max_error_share of the
reward calls raised stops the run with one error naming the function and the first
traceback; at or under the share the step goes on (each failure scored 0, counted)."""

from __future__ import annotations

import pytest

from sparrow.data.reward_runner import RewardBatch
from sparrow.stages.reward import RewardErrorsError, check_error_share

TRACE = (
    'Traceback (most recent call last):\n  File "/x/scoring.py", line 7, in picky\nValueError: no\n'
)


def batch(errors: int, samples: int = 8, timeouts: int = 0) -> RewardBatch:
    failed = errors + timeouts
    return RewardBatch(
        rewards=[0.0] * samples,
        errors=errors,
        timeouts=timeouts,
        first_error="sample 0: ValueError: no" if failed else None,
        first_traceback=TRACE if errors else None,
    )


def test_more_than_the_share_stops_with_the_function_and_traceback():
    with pytest.raises(RewardErrorsError) as err:
        check_error_share("scoring.py:picky", batch(5), 8, 0.5)
    message = str(err.value)
    assert message.startswith("reward function 'scoring.py:picky' raised on 5 of 8 samples")
    assert "data.reward_max_error_share=0.5" in message
    assert message.rstrip().endswith(TRACE.rstrip())


@pytest.mark.parametrize("errors, share", [(4, 0.5), (0, 0.0), (8, 1.0)])
def test_at_or_under_the_share_the_step_goes_on(errors, share):
    check_error_share("exact_match", batch(errors), 8, share)


def test_timeouts_are_not_errors():
    check_error_share("math", batch(0, timeouts=8), 8, 0.0)
    with pytest.raises(RewardErrorsError):
        check_error_share("math", batch(1), 8, 0.0)
