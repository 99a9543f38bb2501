"""Where the trainer ranks and the rollout engines go in the Ray cluster (trainer.num_workers > 0).

    plan = plan_placement(num_workers=2, placement="colocated", num_actors=0, use_gpu=True)
    TrainerGroup.start(spec, 2, placement=plan.trainer)
    ActorPool.start(worker, len(plan.engines), {}, placement=plan.engines)

On GPUs, `colocated` reserves one bundle of one GPU per trainer rank (a Ray placement group
packed onto as few nodes as it fits) and puts rank i and engine i in bundle i with half a GPU
each, so they share that GPU as the trainer and engine share one GPU today (the engine's KV
cache is released while the trainer scores and updates); `separate` gives every rank and every
engine a whole GPU (rollout.num_actors engines, 0: the GPUs the ranks leave). Without GPUs
every rank and engine is a process with an even share of the CPUs. One-step-off
(pipeline.max_staleness=1, docs/async.md) the rollout in flight runs on the engines while the
ranks score and update: on GPUs of their own with `separate`, sharing each GPU with `colocated`.

`strategy` (ray.placement_strategy) is the placement group's: "pack" as above; "strict_spread"
puts each bundle, so each rank with its engines, on a node of its own (a trainer group with a
rank on each of two nodes); "spread" where it can. Without GPUs "pack" reserves nothing, and a
spread reserves one bundle per rank holding the CPU shares of the rank and its engines
(engine j in bundle j mod ranks; one engine per rank when rollout.num_actors is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparrow.errors import SparrowError

# a placement group not ready by then cannot be placed (a strict spread over too few nodes)
PLACEMENT_TIMEOUT_S = 60.0


class PlacementError(SparrowError):
    """The cluster cannot hold the trainer ranks and engines asked for."""


@dataclass
class Placement:
    trainer: list[dict]  # Ray options per trainer rank
    engines: list[dict]  # Ray options per rollout actor
    device: str  # "cuda" or "cpu"
    group: Any = None  # the Ray placement group (colocated GPUs), removed by release()

    def release(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None


def plan_placement(
    num_workers: int, placement: str, num_actors: int, use_gpu: bool, strategy: str = "pack"
) -> Placement:
    import ray

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0)) if use_gpu else 0
    if gpus == 0:
        spread = strategy != "pack"
        engines = num_actors or (num_workers if spread else 1)
        share = max(0.01, float(resources.get("CPU", 1)) / (num_workers + engines))
        if spread:
            return _spread_on_cpus(num_workers, engines, share, strategy)
        return Placement(
            [{"num_cpus": share}] * num_workers, [{"num_cpus": share}] * engines, "cpu"
        )
    if placement == "separate":
        engines = num_actors or gpus - num_workers
        if engines < 1 or num_workers + engines > gpus:
            raise PlacementError(
                f"rollout.placement=separate needs {num_workers} trainer GPUs and at least one "
                f"engine GPU ({engines} asked); the cluster has {gpus} GPUs"
            )
        whole = {"num_gpus": 1, "num_cpus": 1}
        return Placement([whole] * num_workers, [whole] * engines, "cuda")
    if num_workers > gpus or num_actors not in (0, num_workers):
        raise PlacementError(
            f"rollout.placement=colocated puts one engine on each of the trainer.num_workers="
            f"{num_workers} GPUs (rollout.num_actors={num_actors}); the cluster has {gpus} GPUs"
        )
    return _colocated(num_workers, strategy)


def _reserve(bundles: list[dict], strategy: str):
    """A placement group of `bundles`, ready; one that the cluster cannot hold (strict_spread
    with fewer nodes than bundles) is a PlacementError, not a wait forever."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy=strategy.upper())
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        nodes = sum(1 for node in ray.nodes() if node["Alive"])
        raise PlacementError(
            f"ray.placement_strategy={strategy}: the cluster ({nodes} nodes, "
            f"{ray.cluster_resources()}) cannot hold the bundles {bundles} "
            f"within {PLACEMENT_TIMEOUT_S} s"
        )
    return group


def _in_bundle(group, index: int, **resources: float) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        **resources,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index
        ),
    }


def _colocated(num_workers: int, strategy: str) -> Placement:
    group = _reserve([{"GPU": 1, "CPU": 2}] * num_workers, strategy)
    half = [_in_bundle(group, i, num_gpus=0.5, num_cpus=1) for i in range(num_workers)]
    return Placement(half, list(half), "cuda", group)


def _spread_on_cpus(num_workers: int, engines: int, share: float, strategy: str) -> Placement:
    """Bundle i holds rank i and engines i, i + num_workers, ...: its CPUs are their shares."""
    homes = [j % num_workers for j in range(engines)]
    bundles = [{"CPU": share * (1 + homes.count(i))} for i in range(num_workers)]
    group = _reserve(bundles, strategy)
    ranks = [_in_bundle(group, i, num_cpus=share) for i in range(num_workers)]
    return Placement(ranks, [_in_bundle(group, i, num_cpus=share) for i in homes], "cpu", group)
