"""Prompts to rollout actors: one batch per actor by default, or work items taken by load.

    results, times = dispatch(pool, prompts, params, item_prompts=0)  # [prompt][sample]

The prompts are cut into contiguous work items. By default (item_prompts=0) there is one item
per actor, their sizes differing by at most one prompt, so every engine batches its whole
share at once. An engine decodes the samples of one generate() call together, admitting
waiting samples as others finish; separate items run one after another, each costing about
max_new_tokens decode steps whatever its size. Decode steps take nearly the same time over a
wide range of batch sizes, so cutting an engine's share into k items makes its rollout up to k
times longer (2 engines on 16 prompts x 8 samples in items of 2 prompts: 4 x 1,024 decode
steps at 16 samples each, against 1,024 steps at 128 for one engine, measured slower than one
engine). With item_prompts > 0 the items have that many prompts; each actor starts with one
and an actor that returns takes the next, so a faster engine (short samples, a lighter GPU)
takes more items: worth it only where the engines' speeds differ by more than what the extra
items cost. Each request carries its own seed, so a prompt's samples do not depend on which
actor ran it or what else was in its batch; results come back in the prompts' order.
An actor that dies is replaced (ActorPool._replace) and its item is run again once; a second
death on the same item is RolloutActorLost. DispatchTimes says how long each actor was busy
(from handing it an item until its results were back, summed over its items) against the
wall time, so a rollout that did not overlap its engines shows it.
Tests: tests/runtime/test_rollout_actors.py (work_items, dispatch by load).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence


def work_items(count: int, actors: int, item_prompts: int = 0) -> list[range]:
    """Contiguous ranges of prompt indices covering 0..count-1: `item_prompts` each, or
    (0) one per actor, as even as whole prompts allow (fewer when there are fewer prompts)."""
    if item_prompts < 0:
        raise ValueError(f"item_prompts must be >= 0, got {item_prompts}")
    if item_prompts == 0:
        parts = max(1, min(count, actors))
        bounds = [count * k // parts for k in range(parts + 1)]
        return [range(bounds[k], bounds[k + 1]) for k in range(parts) if bounds[k + 1] > bounds[k]]
    return [range(start, min(start + item_prompts, count))
            for start in range(0, count, item_prompts)]


@dataclass
class DispatchTimes:
    """One rollout's timing: wall seconds, and per actor its busy seconds and its items."""

    wall_s: float = 0.0
    busy_s: list[float] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)


def dispatch(pool, prompts: Sequence[Sequence[int]], params: Sequence[Any],
             item_prompts: int = 0) -> tuple[list[list[Any]], DispatchTimes]:
    import ray

    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    clock = time.perf_counter()
    run = _Run(pool, prompts, params, work_items(len(prompts), len(pool.actors), item_prompts))
    for actor in range(len(pool.actors)):
        run.submit(actor)
    while run.running:
        [future], _ = ray.wait(list(run.running), num_returns=1)
        run.submit(run.collect(future))
    run.times.wall_s = time.perf_counter() - clock
    return [sample for item in range(len(run.items)) for sample in run.done[item]], run.times


class _Run:
    """One dispatch's state: items still to hand out, those running, their results."""

    def __init__(self, pool, prompts, params, items: list[range]):
        self.pool, self.prompts, self.params, self.items = pool, prompts, params, items
        self.pending = list(range(len(items)))[::-1]  # popped from the end: item 0 first
        self.done: dict[int, list[list[Any]]] = {}
        self.retried: set[int] = set()
        self.running: dict[Any, tuple[int, int, float]] = {}  # future -> (actor, item, start)
        count = len(pool.actors)
        self.times = DispatchTimes(busy_s=[0.0] * count, items=[0] * count, prompts=[0] * count)

    def submit(self, actor: int) -> None:
        if self.pending:
            item = self.pending.pop()
            chosen = self.items[item]
            future = self.pool.actors[actor].generate.remote(
                [self.prompts[j] for j in chosen], [self.params[j] for j in chosen])
            self.running[future] = (actor, item, time.perf_counter())

    def collect(self, future) -> int:
        """A finished item's results; a dead actor is replaced and its item queued again
        (RolloutActorLost when it already was); any other error cancels the rest. Returns
        the actor, free for the next item."""
        import ray.exceptions

        from runtime.rollout_actors import RolloutActorLost

        actor, item, started = self.running.pop(future)
        try:
            self.done[item] = self.pool._wait([future])[0]
        except ray.exceptions.RayActorError as err:
            if item in self.retried:
                _cancel(self.running)
                raise RolloutActorLost(
                    f"rollout actor {actor} died twice on a work item of "
                    f"{len(self.items[item])} prompts: {err}") from None
            self.retried.add(item)
            self.pool._replace(actor)
            self.pending.append(item)
            return actor
        except BaseException:
            _cancel(self.running)
            raise
        self.times.busy_s[actor] += time.perf_counter() - started
        self.times.items[actor] += 1
        self.times.prompts[actor] += len(self.items[item])
        return actor


def _cancel(running: dict) -> None:
    """Drop what is still running (the actors stay; their results are not wanted)."""
    import ray

    for future in running:
        try:
            ray.cancel(future)
        except Exception:  # noqa: BLE001 - best effort: a finished or actor task may refuse
            pass
