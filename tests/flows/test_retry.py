"""The stage tasks' retry policy under Prefect: an I/O or infrastructure fault is retried
once, a bad input (SparrowError, even one that is an OSError), a shape error or an
assertion fails at once.

Run: `python -m pytest tests/flows/test_retry.py -q`.
"""

from __future__ import annotations

import pytest
from prefect import task
from prefect.cache_policies import NONE

from sparrow.model import CheckpointError
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.runtime.retry import INFRA_RETRIES, is_infrastructure_fault
from sparrow.runtime.rollout.actors import RolloutActorLost

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

CALLS: list[str] = []


@task(cache_policy=NONE, **{**INFRA_RETRIES, "retry_delay_seconds": 0})
def fails_once(error: str) -> str:
    CALLS.append(error)
    if len(CALLS) == 1:
        raise ERRORS[error]("first call fails")
    return "ok"


ERRORS = {
    "os": OSError,
    "actor": RolloutActorLost,
    "value": ValueError,
    "assert": AssertionError,
    "checkpoint": CheckpointError,
    "on_purpose": StageFailedOnPurpose,
}


@pytest.mark.parametrize(
    "error, retried",
    [
        ("os", True),
        ("actor", True),
        ("value", False),
        ("assert", False),
        ("checkpoint", False),
        ("on_purpose", False),
    ],
)
def test_only_infrastructure_faults_are_retried(error, retried):
    CALLS.clear()
    if retried:
        assert fails_once(error) == "ok" and CALLS == [error, error]
    else:
        with pytest.raises(ERRORS[error], match="first call fails"):
            fails_once(error)
        assert CALLS == [error]


def test_classification_without_prefect():
    import ray.exceptions

    assert is_infrastructure_fault(TimeoutError("slow disk"))
    assert is_infrastructure_fault(ray.exceptions.RayActorError())
    assert not is_infrastructure_fault(None)
    assert not is_infrastructure_fault(KeyError("x"))
    assert not is_infrastructure_fault(CheckpointError("missing"))  # a SparrowError first
