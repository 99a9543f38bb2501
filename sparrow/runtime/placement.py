"""Where the trainer ranks and the rollout engines go in the Ray cluster (trainer.num_workers > 0).

    plan = plan_placement(num_workers=2, placement="colocated", num_actors=0, use_gpu=True)
    TrainerGroup.start(spec, 2, placement=plan.trainer)
    ActorPool.start(worker, len(plan.engines), {}, placement=plan.engines)

On GPUs, `colocated` reserves one bundle of one GPU per trainer rank (a Ray placement group
packed onto as few nodes as it fits) and puts rank i and engine i in bundle i with half a GPU
each, so they share that GPU as the trainer and engine share one GPU today (the engine's KV
cache is released while the trainer scores and updates); `separate` gives every rank and every
engine a whole GPU (rollout.num_actors engines, 0: the GPUs the ranks leave). Without GPUs
every rank and engine is a process with an even share of the CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparrow.errors import SparrowError


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


def plan_placement(num_workers: int, placement: str, num_actors: int, use_gpu: bool) -> Placement:
    import ray

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0)) if use_gpu else 0
    if gpus == 0:
        engines = num_actors or 1
        share = max(0.01, float(resources.get("CPU", 1)) / (num_workers + engines))
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
    return _colocated(num_workers)


def _colocated(num_workers: int) -> Placement:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"GPU": 1, "CPU": 2}] * num_workers, strategy="PACK")
    ray.get(group.ready())

    def half(index: int) -> dict:
        return {
            "num_gpus": 0.5,
            "num_cpus": 1,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=index
            ),
        }

    return Placement(
        [half(i) for i in range(num_workers)], [half(i) for i in range(num_workers)], "cuda", group
    )
