"""The one-step-off rollout in flight: which version and schedule a step's rollout takes, a
background generation that the flow settles later (once), a failed one dropped for its stage
to redo, and the engines loading a version's folder only when they hold another.

Run: `python -m pytest tests/runtime/rollout/test_in_flight.py -q`.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sparrow.runtime.rollout.in_flight import (
    InFlightRollout,
    RolloutPlan,
    ensure_engine_version,
    rollout_version,
    schedule_step,
    settle_rollout,
    take_rollout,
)


def test_versions_and_schedule_steps_by_staleness():
    assert [rollout_version(s, 0) for s in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert [rollout_version(s, 1) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    assert [schedule_step(s, 0) for s in (1, 2, 3)] == [1, 2, 3]
    assert [schedule_step(s, 1) for s in (1, 2, 3)] == [1, 1, 2]


class FakePool:
    def __init__(self):
        self.loaded: list[str] = []

    def memory(self):
        return []

    def rollout_stats(self):
        return [{"capture_s": 0.5}]

    def load_weights(self, path, adapter_path=""):
        self.loaded.append(path)


def _runtime():
    events: list[str] = []
    runtime = SimpleNamespace(
        pool=FakePool(),
        pool_on_gpu=False,
        rollout_in_flight=None,
        engine_version=0,
        events=events,
        before_rollout=lambda: events.append("before") or {"release_s": 0.0, "engine_wake_s": 0.0},
        after_rollout=lambda: events.append("after"),
        policy_folder_before=lambda step: f"/policies/before-{step}",
    )
    return runtime


def _plan(step: int) -> RolloutPlan:
    return RolloutPlan(step, 0, None, 1, True, ["row"], ["params"])


def test_a_background_rollout_runs_while_the_caller_goes_on_and_settles_once():
    runtime, release = _runtime(), threading.Event()

    def generate():
        assert release.wait(10)
        return ["row"], [["sample"]], {}

    flight = InFlightRollout(runtime, _plan(2), generate, background=True)
    # the constructor returned with the generation still waiting: it runs in its thread
    assert flight._thread.is_alive() and runtime.events == ["before"]
    release.set()
    done = flight.settle()
    assert done.results == [["sample"]] and done.background and done.engines == [{"capture_s": 0.5}]
    assert flight.settle() is done and runtime.events == ["before", "after"]


def test_a_failed_rollout_raises_where_it_settles_and_is_dropped_before_a_sync():
    runtime = _runtime()

    def generate():
        raise RuntimeError("actor lost twice")

    runtime.rollout_in_flight = InFlightRollout(runtime, _plan(3), generate, background=True)
    with pytest.raises(RuntimeError, match="actor lost twice"):
        runtime.rollout_in_flight.settle()
    assert runtime.events == ["before", "after"]  # the engines gave their memory back
    settle_rollout(runtime)  # what sync_weights and evaluate call: the failure is not theirs
    assert runtime.rollout_in_flight is None


def test_a_step_takes_only_its_own_rollout():
    runtime = _runtime()
    runtime.rollout_in_flight = InFlightRollout(
        runtime, _plan(3), lambda: (["row"], [["s"]], {}), background=False
    )
    assert take_rollout(runtime, 2) is None and runtime.rollout_in_flight is None
    flight = InFlightRollout(runtime, _plan(3), lambda: (["row"], [["s"]], {}), background=False)
    runtime.rollout_in_flight = flight
    assert take_rollout(runtime, 3) is flight and runtime.rollout_in_flight is None


def test_engines_load_a_version_only_when_they_hold_another():
    runtime = _runtime()
    ensure_engine_version(runtime, 0)
    assert runtime.pool.loaded == []
    ensure_engine_version(runtime, 2)  # the policy after update 2: policy_folder_before(3)
    ensure_engine_version(runtime, 2)
    assert runtime.pool.loaded == ["/policies/before-3"] and runtime.engine_version == 2
