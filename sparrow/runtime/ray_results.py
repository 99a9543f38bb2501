"""Results of several Ray calls that depend on one another, taken as each finishes.

    results = results_failing_fast(futures, on_failure)   # in the order of `futures`
    node_id()                                             # the Ray node of this process

Calls that meet in a collective (trainer ranks, a weight broadcast) wait for each other: one
that fails leaves the rest waiting until the collective's timeout. Taking the results as
they come finds the first failure at once; `on_failure(index, cause, waiting)` (the failed
call's index, its error's cause, the futures not finished then) stops what waits, and the
error is raised (sparrow/runtime/trainer_group/group.py, sparrow/runtime/rollout/weight_sync.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def node_id() -> str:
    """The Ray node this process runs on ("" outside Ray): recorded with an actor's or a
    rank's pid, so a run on several nodes says where each ran."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def results_failing_fast(
    futures: list[Any], on_failure: Callable[[int, BaseException, list[Any]], None]
) -> list[Any]:
    import ray
    import ray.exceptions

    results: dict[Any, Any] = {}
    pending = list(futures)
    while pending:
        [ready], pending = ray.wait(pending, num_returns=1)
        try:
            results[ready] = ray.get(ready)
        except ray.exceptions.RayError as err:
            waiting = ray.wait(pending, num_returns=len(pending), timeout=0)[1] if pending else []
            on_failure(futures.index(ready), getattr(err, "cause", None) or err, waiting)
            raise
    return [results[future] for future in futures]


def first_line(error: BaseException) -> str:
    """An error's first line (Ray's task errors run on with the remote traceback)."""
    return (str(error).splitlines() or [type(error).__name__])[0]
