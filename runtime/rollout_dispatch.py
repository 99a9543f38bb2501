"""Prompts to rollout actors by load: work items go to whichever actor finishes first.

    results = generate_by_load(pool, prompts, params, item_prompts=0)   # [prompt][sample]

The prompts are cut into contiguous work items (`item_prompts` each; 0 picks about four items
per actor, and one item when there is a single actor, so one engine still batches everything
at once). Each actor starts with one item; an actor that returns takes the next one, so a fast
engine (short samples, a lighter GPU load) takes more items than a slow one instead of waiting
on a fixed shard. Each request carries its own seed, so a prompt's samples do not depend on
which actor ran it or what else was in its batch; results come back in the prompts' order.
An actor that dies is replaced (ActorPool._replace) and its item is run again once; a second
death on the same item is RolloutActorLost.
Tests: tests/runtime/test_rollout_actors.py (work_items, dispatch by load).
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def work_items(count: int, actors: int, item_prompts: int = 0) -> list[range]:
    """Contiguous ranges of prompt indices covering 0..count-1."""
    if item_prompts < 0:
        raise ValueError(f"item_prompts must be >= 0, got {item_prompts}")
    if item_prompts == 0:
        item_prompts = count if actors <= 1 else math.ceil(count / (4 * actors))
    size = max(1, item_prompts)
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def generate_by_load(pool, prompts: Sequence[Sequence[int]], params: Sequence[Any],
                     item_prompts: int = 0) -> list[list[Any]]:
    import ray
    import ray.exceptions

    from runtime.rollout_actors import RolloutActorLost

    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    items = work_items(len(prompts), len(pool.actors), item_prompts)
    pending = list(range(len(items)))[::-1]  # popped from the end: item 0 first
    done: dict[int, list[list[Any]]] = {}
    retried: set[int] = set()
    running: dict[Any, tuple[int, int]] = {}  # future -> (actor index, item index)

    def submit(actor: int) -> None:
        if pending:
            item = pending.pop()
            chosen = items[item]
            future = pool.actors[actor].generate.remote([prompts[j] for j in chosen],
                                                        [params[j] for j in chosen])
            running[future] = (actor, item)

    for actor in range(len(pool.actors)):
        submit(actor)
    while running:
        [future], _ = ray.wait(list(running), num_returns=1)
        actor, item = running.pop(future)
        try:
            done[item] = pool._wait([future])[0]
        except ray.exceptions.RayActorError as err:
            if item in retried:
                _cancel(running)
                raise RolloutActorLost(
                    f"rollout actor {actor} died twice on a work item of {len(items[item])} "
                    f"prompts: {err}") from None
            retried.add(item)
            pool._replace(actor)
            pending.append(item)
        except BaseException:
            _cancel(running)
            raise
        submit(actor)
    return [sample for item in range(len(items)) for sample in done[item]]


def _cancel(running: dict) -> None:
    """Drop what is still running (the actors stay; their results are not wanted)."""
    import ray

    for future in running:
        try:
            ray.cancel(future)
        except Exception:  # noqa: BLE001 - best effort: a finished or actor task may refuse
            pass
