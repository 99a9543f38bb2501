"""Prompts to rollout actors: taken by each engine while it runs, or in work items.

    results, times = dispatch(pool, prompts, params, item_prompts=0)  # [prompt][sample]

By default (item_prompts=0) with native engines (two or more; one actor gets one work item,
the same batch), the prompts wait in a PromptSource actor,
split into one contiguous queue per actor, and every actor runs one generate() call that
takes requests from it whenever its batch has room (at the start, and as samples stop:
sparrow/engine's feed), one prompt at a time. An actor takes from its own queue first;
with its queue empty it takes from the tail of the longest queue of an actor that said its
batch is full (the engine's feed.full()), so prompts waiting behind a full engine go to one
with room, and an engine that could still take its own share is never robbed of it. With
nothing to take now it asks again as its samples stop (or, running nothing, after a short
sleep); once every queue is empty its call returns. The load is continuous: an engine whose
samples stop early (short answers, a faster GPU) refills its batch from the others' queues,
and a batch is never cut into separate calls.
With item_prompts > 0 (or the vLLM backend, whose engine cannot take requests mid-call) the
prompts are cut into contiguous work items: one per actor (item_prompts=0), their sizes
differing by at most one prompt, or item_prompts each, handed to whichever actor is free.
Separate items run one after another, each costing about max_new_tokens decode steps whatever
its size, so cutting an engine's share into k items makes its rollout up to k times longer
(measured: 2 engines on 16 prompts x 8 samples in items of 2 prompts, slower than one engine).
Each request carries its own seed, so a prompt's samples do not depend on which actor ran it
or what else was in its batch; results come back in the prompts' order.
An actor that dies is replaced (ActorPool._replace): with the source, the prompts it had
taken go back to the front of its queue and the new actor runs its call again; with items,
its item is run again. A second death (of the same actor's call, or on the same item) is
RolloutActorLost. DispatchTimes says how long each actor was busy (from handing it work until
its results were back, summed over its calls) against the wall time, so a rollout that did
not overlap its engines shows it.
Tests: tests/runtime/rollout/test_actors.py (the source's queues and stealing, dispatch).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def work_items(count: int, actors: int, item_prompts: int = 0) -> list[range]:
    """Contiguous ranges of prompt indices covering 0..count-1: `item_prompts` each, or
    (0) one per actor, as even as whole prompts allow (fewer when there are fewer prompts)."""
    if item_prompts < 0:
        raise ValueError(f"item_prompts must be >= 0, got {item_prompts}")
    if item_prompts == 0:
        parts = max(1, min(count, actors))
        bounds = [count * k // parts for k in range(parts + 1)]
        return [range(bounds[k], bounds[k + 1]) for k in range(parts) if bounds[k + 1] > bounds[k]]
    return [
        range(start, min(start + item_prompts, count)) for start in range(0, count, item_prompts)
    ]


@dataclass
class DispatchTimes:
    """One rollout's timing: wall seconds, and per actor its busy seconds and its items."""

    wall_s: float = 0.0
    busy_s: list[float] = field(default_factory=list)
    items: list[int] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)


def dispatch(
    pool, prompts: Sequence[Sequence[int]], params: Sequence[Any], item_prompts: int = 0
) -> tuple[list[list[Any]], DispatchTimes]:
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
    if item_prompts == 0 and pool.pulls:
        return dispatch_pulled(pool, prompts, params)
    clock = time.perf_counter()
    run = _Run(pool, prompts, params, work_items(len(prompts), len(pool.actors), item_prompts))
    return _drive(run, clock)


def _drive(run: _Run, clock: float) -> tuple[list[list[Any]], DispatchTimes]:
    """Every actor busy until the work items run out; (results in item order, timings)."""
    import ray

    for actor in range(len(run.pool.actors)):
        run.submit(actor)
    while run.running:
        [future], _ = ray.wait(list(run.running), num_returns=1)
        run.submit(run.collect(future))
    run.times.wall_s = time.perf_counter() - clock
    return [sample for item in range(len(run.items)) for sample in run.done[item]], run.times


@dataclass(frozen=True)
class CloseRule:
    """A rollout that closes early (rollout.finish_fraction < 1, docs/async.md): labels[i]
    is request i's group (nondecreasing: a group's requests are contiguous); the batch closes
    once `fraction` of its groups finished, the `required` ones among them."""

    labels: tuple[int, ...]
    fraction: float
    required: frozenset[int] = frozenset()

    def items(self, actors: int) -> list[range]:
        """One contiguous item of whole groups per actor (as even as whole groups allow)."""
        starts = [i for i, label in enumerate(self.labels) if i == 0 or label != self.labels[i - 1]]
        bounds = starts + [len(self.labels)]
        return [
            range(bounds[part.start], bounds[part.stop]) for part in work_items(len(starts), actors)
        ]

    def close_of(self, item: range):
        """The EarlyClose of one item: its own share of groups closes it."""
        from sparrow.engine.close import EarlyClose, groups_to_close

        labels = self.labels[item.start : item.stop]
        return EarlyClose(
            labels,
            groups_to_close(self.fraction, len(set(labels))),
            frozenset(self.required & set(labels)),
        )


def dispatch_closing(
    pool, prompts: Sequence[Sequence[int]], params: Sequence[Any], rule: CloseRule
) -> tuple[list[list[Any]], DispatchTimes]:
    """Whole groups in one work item per actor, each one generate() call that closes on its
    own share (so the cut does not depend on timing between actors); results in order."""
    if not len(prompts) == len(params) == len(rule.labels):
        raise ValueError(f"{len(prompts)} prompts, {len(params)} params, {len(rule.labels)} labels")
    clock = time.perf_counter()
    items = rule.items(len(pool.actors))
    run = _Run(pool, prompts, params, items, [rule.close_of(item) for item in items])
    return _drive(run, clock)


class PromptSource:
    """One rollout's requests (index, prompt, params) in one queue per actor (contiguous, as
    even as whole prompts allow); the body of a Ray actor that the engines call, loaded
    anew for each rollout."""

    def __init__(self, requests: Sequence[tuple[int, Any, Any]] = (), actors: int = 1):
        self.rollout = 0
        self.load(requests, actors)

    def load(self, requests: Sequence[tuple[int, Any, Any]], actors: int) -> int:
        """A new rollout's requests; returns its number, which takes and fulls must carry
        (an engine still running a cancelled rollout's call gets None: no more)."""
        self.rollout += 1
        self.queues = [deque(requests[r.start : r.stop]) for r in work_items(len(requests), actors)]
        self.queues += [deque() for _ in range(actors - len(self.queues))]
        self.taken: list[list] = [[] for _ in range(actors)]  # by a call still running
        self.is_full = [False] * actors
        return self.rollout

    def take(self, actor: int, rollout: int | None = None):
        """The actor's next request; else one from the tail of the longest queue of a full
        actor; else () while any queue holds requests (ask again), None when all are empty
        (or the call belongs to an earlier rollout)."""
        if rollout not in (None, self.rollout):
            return None
        self.is_full[actor] = False
        queue = self.queues[actor]
        if not queue:
            victims = [q for q, full in zip(self.queues, self.is_full) if full and q]
            if not victims:
                return () if any(self.queues) else None
            request = max(victims, key=len).pop()
        else:
            request = queue.popleft()
        self.taken[actor].append(request)
        return request

    def full(self, actor: int, rollout: int | None = None) -> None:
        """The actor's batch has no room: its queue may be taken by others."""
        if rollout in (None, self.rollout):
            self.is_full[actor] = True

    def put_back(self, actor: int) -> int:
        """An actor died: what it took goes back to the front of its queue (for its
        replacement, or another engine with room). Returns the count."""
        back, self.taken[actor] = self.taken[actor], []
        self.queues[actor].extendleft(reversed(back))
        self.is_full[actor] = False
        return len(back)


def dispatch_pulled(
    pool, prompts: Sequence[Sequence[int]], params: Sequence[Any]
) -> tuple[list[list[Any]], DispatchTimes]:
    """Every actor runs one generate_from() call over a PromptSource (see the module doc)."""
    import ray
    import ray.exceptions

    from sparrow.runtime.rollout.actors import RolloutActorLost

    clock = time.perf_counter()
    count = len(pool.actors)
    times = DispatchTimes(busy_s=[0.0] * count, items=[0] * count, prompts=[0] * count)
    requests = [(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    source = pool.prompt_source()
    rollout = ray.get(source.load.remote(requests, count))
    results: list[Any] = [None] * len(prompts)
    running: dict[Any, tuple[int, float]] = {}
    lost: set[int] = set()

    def start(actor: int) -> None:
        running[pool.actors[actor].generate_from.remote(source, actor, rollout)] = (
            actor,
            time.perf_counter(),
        )

    try:
        for actor in range(count):
            start(actor)
        while running:
            [future], _ = ray.wait(list(running), num_returns=1)
            actor, started = running.pop(future)
            try:
                pairs = pool._wait([future])[0]
            except ray.exceptions.RayActorError as err:
                if actor in lost:
                    raise RolloutActorLost(
                        f"rollout actor {actor} died twice in one rollout: {err}"
                    ) from None
                lost.add(actor)
                pool._replace(actor)
                ray.get(source.put_back.remote(actor))
                start(actor)
                continue
            for index, samples in pairs:
                results[index] = samples
            times.busy_s[actor] += time.perf_counter() - started
            times.items[actor] += 1
            times.prompts[actor] += len(pairs)
    except BaseException:
        _cancel(running)
        raise
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"the rollout ended without results for prompts {missing[:8]}")
    times.wall_s = time.perf_counter() - clock
    return results, times


class _Run:
    """One dispatch's state: items still to hand out, those running, their results."""

    def __init__(self, pool, prompts, params, items: list[range], closes: list | None = None):
        self.pool, self.prompts, self.params, self.items = pool, prompts, params, items
        self.closes = closes  # per item: its EarlyClose (dispatch_closing)
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
                [self.prompts[j] for j in chosen],
                [self.params[j] for j in chosen],
                *([] if self.closes is None else [self.closes[item]]),
            )
            self.running[future] = (actor, item, time.perf_counter())

    def collect(self, future) -> int:
        """A finished item's results; a dead actor is replaced and its item queued again
        (RolloutActorLost when it already was); any other error cancels the rest. Returns
        the actor, free for the next item."""
        import ray.exceptions

        from sparrow.runtime.rollout.actors import RolloutActorLost

        actor, item, started = self.running.pop(future)
        try:
            self.done[item] = self.pool._wait([future])[0]
        except ray.exceptions.RayActorError as err:
            if item in self.retried:
                _cancel(self.running)
                raise RolloutActorLost(
                    f"rollout actor {actor} died twice on a work item of "
                    f"{len(self.items[item])} prompts: {err}"
                ) from None
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
