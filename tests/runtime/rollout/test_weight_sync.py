"""sparrow/runtime/rollout/weight_sync.py's transfer: a party that fails while others still wait in the
broadcast stops the trainer group and kills the engines waiting, at once; a sync that fails
with no one waiting leaves the group alone. And a stopped group's policy is read from its
folder (RunRuntime.trainer_after)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sparrow.runtime.rollout.weight_sync import transfer
from sparrow.runtime.run_runtime import RunRuntime

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_up(flow_environment):
    flow_environment.start_ray()


class Group:
    """Records why the sync stopped it (TrainerGroup.stop also kills the ranks)."""

    failed = ""

    def stop(self, why: str) -> None:
        self.failed = why


def parties():
    import ray

    @ray.remote(num_cpus=0)
    class Party:  # rank 0 or an engine: waits in the "broadcast", or fails in it
        def wait(self, seconds: float) -> str:
            time.sleep(seconds)
            return "done"

        def fail(self) -> None:
            raise RuntimeError("the engine died mid-broadcast")

        def ping(self) -> str:
            return "alive"

    return Party.remote(), Party.remote(), Party.remote()


def test_a_party_that_fails_while_others_wait_stops_them_at_once(ray_up):
    import ray
    import ray.exceptions

    rank0, failing, waiting = parties()
    group = Group()
    futures = [rank0.wait.remote(60), failing.fail.remote(), waiting.wait.remote(60)]
    clock = time.perf_counter()
    with pytest.raises(ray.exceptions.RayTaskError, match="died mid-broadcast"):
        transfer(group, [rank0, failing, waiting], futures)
    assert time.perf_counter() - clock < 30  # not the 60 s the others would wait
    assert group.failed == (
        "the weight sync failed on engine 0 of the sync: the engine died mid-broadcast"
    )
    with pytest.raises(ray.exceptions.RayActorError):  # the engine left waiting was killed
        ray.get(waiting.ping.remote(), timeout=30)
    assert ray.get(failing.ping.remote()) == "alive"  # its own error: the pool decides
    for party in (rank0, failing):
        ray.kill(party)


def test_a_sync_that_fails_with_no_one_waiting_leaves_the_group(ray_up):
    import ray
    import ray.exceptions

    rank0, failing, _ = parties()
    group = Group()
    futures = [rank0.wait.remote(0), failing.fail.remote()]
    ray.wait(futures, num_returns=2)  # both ended: rank 0 sent, the engine failed after
    with pytest.raises(ray.exceptions.RayTaskError):
        transfer(group, [rank0, failing], futures)
    assert group.failed == ""
    assert ray.get(rank0.wait.remote(0)) == "done"
    for party in (rank0, failing):
        ray.kill(party)


def test_a_stopped_group_is_not_the_trainer_after_its_step():
    kept = SimpleNamespace(failed="")
    stopped = SimpleNamespace(failed="the trainer group was stopped after ...")
    assert RunRuntime.trainer_after(SimpleNamespace(_trainer=kept, _trainer_step=3), 3) is kept
    assert RunRuntime.trainer_after(SimpleNamespace(_trainer=kept, _trainer_step=2), 3) is None
    assert RunRuntime.trainer_after(SimpleNamespace(_trainer=stopped, _trainer_step=3), 3) is None
