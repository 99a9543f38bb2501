"""DistillSparse with a trainer group: the LoRA step runs on the group's ranks.

    distiller = GroupDistiller.start(group, DistillSpec(folder="", seed=0))   # or a folder
    metrics = distiller.distill(records, schedule, advantages)   # as SparseDistiller.distill
    distiller.save(folder)            # SparseDistiller's folder, written by rank 0
    distiller.release_base()          # while the engines roll out
    modes = sync_group_to_pool(group, pool, policy_dir, bucket_bytes, adapter_dir)

Each rank holds a ShardedDistiller (rl/sharded_distill.py) beside its ShardedPolicyTrainer;
distill() takes the policy after this step's update from the rank's own shards (gathered
tensor by tensor), so no weights pass through the driver, then runs the LoRA step data
parallel over the ranks. The LoRA and its AdamW are the same on every rank, and rank 0 saves
the single-process folder (adapter, distill_optimizer.pt, distill_state.json): a run may
resume it with another trainer.num_workers, 0 included. For the engines, rank 0 merges the
saved adapter into the gathered weights before the broadcast (TrainerRank.gather_for_sync);
the trainer keeps the plain policy. DistillRank holds the rank side (TrainerRank inherits it).
Tests: tests/runtime/trainer_group/test_group.py (gloo), tests/trainer/test_sharded_distill.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DistillSpec:
    """What each rank's distiller is built from (plain values, pickled to Ray)."""

    folder: str = ""  # a distill_lora folder to resume; "": a fresh adapter seeded by `seed`
    seed: int = 0
    temperature: float = 1.0
    centroid_dtype: str = "cache"


class DistillRank:
    """The distiller side of a TrainerRank (needs its `trainer` and `rank`)."""

    distiller: Any = None

    def start_distiller(self, spec: Any, distill: DistillSpec) -> int:
        from sparrow.trainer.sharded_distill import ShardedDistiller

        options = dict(
            temperature=distill.temperature,
            centroid_dtype=distill.centroid_dtype,
            trainer_config=spec.trainer_config,
        )
        device = self.trainer.device
        self.distiller = None
        if distill.folder:
            self.distiller = ShardedDistiller.load(
                distill.folder, spec.model_path, spec.algo, device, spec.dtype, **options
            )
        else:
            self.distiller = ShardedDistiller(
                spec.model_path, spec.algo, device, spec.dtype, distill.seed, **options
            )
        return self.distiller.updates

    def distill(self, records, schedule, advantages, update: bool, cheaper) -> tuple | None:
        """The rank's trainer weights as the base (a collective), then one LoRA step."""
        self.trainer.onload()
        self.distiller.set_base_from(self.trainer)
        metrics = self.distiller.distill(
            records, schedule, advantages, update=update, cheaper=cheaper
        )
        return (metrics, self.distiller.bin_stats) if self.rank == 0 else None

    def save_distiller(self, folder: str) -> str:
        return str(self.distiller.save(folder))

    def release_distiller_base(self) -> None:
        self.distiller.release_base()


class GroupDistiller:
    """SparseDistiller's interface for the train flow, over a TrainerGroup's ranks."""

    def __init__(self, group: Any, updates: int):
        self.group, self.updates = group, updates
        self.bin_stats: dict[str, list] = {}

    @classmethod
    def start(cls, group: Any, distill: DistillSpec) -> GroupDistiller:
        return cls(group, group._all("start_distiller", group.spec, distill)[0])

    def distill(
        self,
        records: Sequence[Any],
        schedule: Any,
        advantages: Sequence[float] | None = None,
        update: bool = True,
        cheaper: Any = None,
    ) -> dict[str, float]:
        advantages = None if advantages is None else list(advantages)
        metrics, self.bin_stats = self.group._all(
            "distill", list(records), schedule, advantages, update, cheaper
        )[0]
        self.updates = int(metrics["distill/updates"])
        return metrics

    def save(self, folder) -> Any:
        import ray

        self.group.wait_for_save()
        ray.get(self.group.actors[0].save_distiller.remote(str(folder)))
        return Path(folder)

    def release_base(self) -> None:
        self.group._all("release_distiller_base")
