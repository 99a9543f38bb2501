"""A rollout that runs on the actors while the flow goes on: the one-step-off pipeline's.

    flight = InFlightRollout(runtime, plan, generate, background=True)  # returns at once
    ...                                      # dense_score, the update: the engines generate
    done = flight.settle()                   # waits; the engines give their memory back
    settle_rollout(runtime)                  # before anything else uses the actors
    flight = take_rollout(runtime, step)     # the rollout stage of `step` collects its own

With pipeline.max_staleness=1 (docs/async.md) the flow starts the rollout of step n+1 in a
thread of its own once step n's rewards are in, from the weights the engines hold (update
n-1's), and goes on with step n's scoring and update; whatever next needs the actors (step
n's sync_weights or evaluate) settles it first, and the rollout stage of step n+1 writes and
records it. Nothing about it is recorded until then: a run that stops with a rollout in flight
loses it, and the resumed rollout stage generates it again from the same inputs (the plan:
prompts, seeds, schedule and policy version are functions of the step), so no sample is lost
or repeated. A rollout that failed in flight is dropped and generated again by its stage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparrow.runtime.run_runtime import RunRuntime
    from sparrow.sparse import Schedule


def rollout_version(step: int, max_staleness: int) -> int:
    """The policy version the rollout of `step` is generated with: the update max_staleness
    steps before the one the step starts from (0: the initial model)."""
    return max(0, step - 1 - max_staleness)


def schedule_step(step: int, max_staleness: int) -> int:
    """The step whose schedule in force the rollout of `step` decodes with: the one current
    when it starts (a one-step-off rollout starts before the previous step re-optimizes)."""
    return max(1, step - max_staleness)


@dataclass(frozen=True)
class RolloutPlan:
    """Everything a rollout is a function of, fixed by its step."""

    step: int
    policy_version: int
    schedule: Schedule
    schedule_version: int
    sparse: bool
    rows: list[Any]
    params: list[Any]


@dataclass(frozen=True)
class SettledRollout:
    rows: list[Any]
    results: list[Any]
    dynamic: dict[str, float]
    elapsed: float  # seconds inside generate
    handover: dict[str, float]  # runtime.before_rollout's seconds
    memory: list[dict[str, float]]  # the engines' memory when generate ended (GPU)
    released: list[dict[str, float]]  # and after they gave it back
    engines: list[dict[str, float]]  # pool.rollout_stats()
    launched_at: str  # ISO time the generation started
    background: bool


@dataclass
class InFlightRollout:
    """A started rollout; `generate()` returns (rows, results, dynamic metrics)."""

    runtime: RunRuntime
    plan: RolloutPlan
    generate: Callable[[], tuple[list[Any], list[Any], dict[str, float]]]
    background: bool
    _output: tuple | None = None
    _error: BaseException | None = None
    _elapsed: float = 0.0
    _settled: SettledRollout | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    launched_at: str = field(init=False, default="")
    handover: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.launched_at = datetime.now(UTC).replace(tzinfo=None).isoformat()
        self.handover = self.runtime.before_rollout()
        if self.background:
            self._thread = threading.Thread(
                target=self._run, name=f"rollout-step-{self.plan.step}", daemon=True
            )
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        clock = time.perf_counter()
        try:
            self._output = self.generate()
        except BaseException as err:  # handed to whoever settles it, in the flow's thread
            self._error = err
        finally:
            self._elapsed = time.perf_counter() - clock

    def settle(self) -> SettledRollout:
        """Wait for the generation; the engines give their memory back (the error of a failed
        generation is raised here)."""
        if self._settled is not None:
            return self._settled
        if self._thread is not None:
            self._thread.join()
        pool = self.runtime.pool
        try:
            if self._error is not None:
                raise self._error
            memory = pool.memory() if self.runtime.pool_on_gpu else []
            engines = pool.rollout_stats()  # since the last rollout's: this one's wake too
        finally:
            self.runtime.after_rollout()
        rows, results, dynamic = self._output
        self._settled = SettledRollout(
            rows=rows,
            results=results,
            dynamic=dynamic,
            elapsed=self._elapsed,
            handover=self.handover,
            memory=memory,
            released=pool.memory() if self.runtime.pool_on_gpu else [],
            engines=engines,
            launched_at=self.launched_at,
            background=self.background,
        )
        return self._settled


def settle_rollout(runtime: RunRuntime) -> None:
    """Wait for a rollout in flight before the actors do anything else; one that failed is
    dropped (its own stage generates it again)."""
    flight = runtime.rollout_in_flight
    if flight is None:
        return
    try:
        flight.settle()
    except Exception:
        runtime.rollout_in_flight = None


def take_rollout(runtime: RunRuntime, step: int) -> InFlightRollout | None:
    """The rollout of `step` if it was started in flight (then no longer held), else None."""
    flight = runtime.rollout_in_flight
    if flight is None:
        return None
    runtime.rollout_in_flight = None
    if flight.plan.step == step:
        return flight
    try:  # another step's (a flow that skipped ahead): the actors must be free, the rest goes
        flight.settle()
    except Exception:
        pass
    return None


def ensure_engine_version(runtime: RunRuntime, version: int) -> None:
    """The engines hold policy `version` (they load its policy folder when they do not):
    after a resume, or when a one-step-off rollout needs the weights before the last sync."""
    if runtime.engine_version == version:
        return
    folder = runtime.policy_folder_before(version + 1)
    runtime.pool.load_weights(str(folder))
    runtime.engine_version = version
