"""Retry policy of the stage tasks: retry I/O and infrastructure faults, never a bad input.

    @task(cache_policy=NONE, **INFRA_RETRIES)
    def reward_task(...): ...

A stage may be retried when it failed on an OSError (a full disk, a flaky network file
system), a lost Ray actor or node, or a DuckDB file briefly locked; never when it failed on a
SparrowError (a bad config, dataset or checkpoint: the message names it and a retry would only
repeat it), a shape error, an assertion or StageFailedOnPurpose. Stages are idempotent
(sparrow/runtime/ledger/stage.py), so a retry simply runs the stage again from its inputs.
"""

from __future__ import annotations

from typing import Any

from sparrow.errors import SparrowError
from sparrow.runtime.rollout.actors import RolloutActorLost


def is_infrastructure_fault(error: BaseException | None) -> bool:
    if error is None or isinstance(error, SparrowError):
        return False
    import duckdb
    import ray.exceptions

    infrastructure = (
        OSError,
        TimeoutError,
        RolloutActorLost,
        duckdb.IOException,
        ray.exceptions.RayActorError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.ObjectLostError,
    )
    return isinstance(error, infrastructure)


def _failure(state: Any) -> BaseException | None:
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - a state without a readable result: do not retry
        return None
    return result if isinstance(result, BaseException) else None


def retry_on_infrastructure(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry_condition_fn: True lets the task's retries apply."""
    return is_infrastructure_fault(_failure(state))


# keyword arguments for @task: one retry, after a second, for infrastructure faults only
INFRA_RETRIES: dict[str, Any] = dict(
    retries=1, retry_delay_seconds=1, retry_condition_fn=retry_on_infrastructure
)
