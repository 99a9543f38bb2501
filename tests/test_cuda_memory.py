"""sparrow/cuda_memory.py's frozen heaps: what the collector skips inside frozen_heap and after
freeze_actor_heap, that garbage made since is still collected, that the run's body is inside
one (and leaves it, even on an error), and that only a Ray actor's own process freezes.

Run: `python -m pytest tests/test_cuda_memory.py -q`.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from sparrow.cuda_memory import freeze_actor_heap, frozen_heap


class Node:
    def __init__(self):
        self.other = self  # a cycle: only the collector frees it


def test_inside_the_heap_at_entry_is_frozen_and_new_cycles_are_still_collected():
    before = gc.get_freeze_count()
    old = Node()
    with frozen_heap():
        assert gc.get_freeze_count() > before
        new = weakref.ref(Node())  # garbage made inside
        gc.collect()
        assert new() is None
        kept = weakref.ref(old)
        del old  # frozen at entry: out of the collector's sight until exit
        gc.collect()
        assert kept() is not None
    assert gc.get_freeze_count() == before
    gc.collect()
    assert kept() is None


def _in_the_collectors_sight(objects) -> int:
    """How many of `objects` a collection would visit (frozen ones are in no generation).
    By identity, not gc.get_freeze_count(): that count also drops when any frozen object of
    the process (another thread's, pytest's) is freed meanwhile."""
    ids = {id(o) for o in objects}
    return sum(id(o) in ids for o in gc.get_objects())


def test_a_heap_frozen_already_is_frozen_further_and_left_for_its_owner_to_thaw():
    gc.freeze()  # someone (a library, the caller) froze the heap of its time
    try:
        made_since = [Node() for _ in range(10_000)]
        assert _in_the_collectors_sight(made_since) == len(made_since)
        with frozen_heap(), frozen_heap():  # then the run, and a nested one
            assert _in_the_collectors_sight(made_since) == 0
        assert _in_the_collectors_sight(made_since) == 0  # the thaw is the owner's
    finally:
        gc.unfreeze()
    assert _in_the_collectors_sight(made_since) == len(made_since)


def test_the_heap_thaws_when_the_body_raises():
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("a failed run")
    assert gc.get_freeze_count() == before


def test_the_train_flow_opens_its_run_inside_a_frozen_heap_and_thaws_on_failure(monkeypatch):
    from sparrow.flows import train

    seen = []

    def open_run(cfg):
        seen.append(gc.get_freeze_count())
        raise RuntimeError("the run's services did not start")

    monkeypatch.setattr(train, "open_run_runtime", open_run)
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError, match="did not start"):
        train.train_flow.fn(["pipeline.steps=1"], show_table=False)
    assert seen and seen[0] > before and gc.get_freeze_count() == before


def test_only_a_ray_actors_own_process_freezes(flow_environment):
    assert freeze_actor_heap() is False  # this process: no actor (Ray running or not)
    flow_environment.start_ray()
    assert freeze_actor_heap() is False  # the driver of a running Ray
    import ray

    @ray.remote(num_cpus=0)
    class Probe:  # as RolloutWorker and TrainerRank: the freeze in the constructor
        def __init__(self):
            self.froze = freeze_actor_heap()

        def freeze(self) -> tuple[bool, int]:
            return self.froze, gc.get_freeze_count()

    probe = Probe.remote()
    froze, count = ray.get(probe.freeze.remote())
    ray.kill(probe)
    assert froze and count > 1000
