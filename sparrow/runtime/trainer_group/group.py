"""The trainer as a group of Ray actors: ShardedPolicyTrainer (FSDP2) on N ranks, driven like
one PolicyTrainer.

    group = TrainerGroup.start(TrainerSpec(model_path, algo, config.trainer, seed=0), num_workers=2)
    group = TrainerGroup.start(spec, 2, resume_from=folder)    # saved by any N, or one process
    scores = group.score(records)                              # as PolicyTrainer.score
    stale = group.score_checkpoint(folder, records)            # rank 0, an older policy folder
    metrics = group.update(records, rewards, old, group_size=8)
    group.save(folder)                 # HF safetensors + optimizer shards (rl/sharded_checkpoint.py)
    modes = sync_group_to_pool(group, pool, folder, bucket_bytes)   # sparrow/runtime/rollout/weight_sync.py
    group.shutdown()

Each rank is an actor (one GPU each, or one CPU with gloo); rank 0's node and a free port there
make the rendezvous of torch.distributed. Every call goes to all ranks at once with the same
arguments (the records travel once, through Ray's object store); results come from rank 0,
since ShardedPolicyTrainer gives every rank the same scores and metrics. `placement` gives
each rank's Ray options (sparrow/runtime/placement.py: a GPU bundle shared with a rollout engine).
A folder the group saved also resumes in one process (PolicyTrainer.load, the train flow's
trainer.num_workers=0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparrow.errors import SparrowError
from sparrow.runtime.ray_results import first_line, results_failing_fast
from sparrow.runtime.trainer_group.rank import TrainerRank, TrainerSpec


def without_topk(records: Sequence[Any]) -> list[Any]:
    """The records as the update reads them: the actor's top-K (read by scoring only, 20
    values per token) left out as [tokens, 0] arrays, so every rank's copy through Ray's
    object store is that much smaller."""
    from dataclasses import replace

    import numpy as np

    return [
        replace(
            r,
            topk_ids=np.zeros((len(r.output_ids), 0), np.int32),
            topk_logprobs=np.zeros((len(r.output_ids), 0), np.float32),
        )
        for r in records
    ]


class TrainerGroupError(SparrowError):
    """The trainer group could not start, or was stopped when a rank failed (the message
    names the rank and the cause)."""


class TrainerGroup:
    """N TrainerRank actors (see the module doc); a Trainer (sparrow/trainer/protocol.py)."""

    sharded = True  # weights and optimizer state split over the ranks

    def __init__(self, spec: TrainerSpec, actors: list[Any]):
        import torch

        self.spec, self.actors = spec, actors
        self.device = torch.device(spec.device)
        self.step = 0
        self.sync_key: tuple = ()  # the engines the sync group was built for
        self.last_sync: dict = {}  # the last sync's phases (sparrow/runtime/rollout/weight_sync.py)
        self._saving: list = []
        self.failed = ""  # why the group was stopped, once a rank failed

    @classmethod
    def start(
        cls,
        spec: TrainerSpec,
        num_workers: int,
        placement: Sequence[dict] | None = None,
        resume_from: str = "",
    ) -> TrainerGroup:
        import ray
        import ray.exceptions

        default = (
            {"num_gpus": 1, "num_cpus": 1}
            if spec.device == "cuda"
            else {"num_cpus": max(1, spec.threads)}
        )
        options = list(placement) if placement else [default] * num_workers
        remote = ray.remote(max_restarts=0, max_task_retries=0)(TrainerRank)
        actors = [
            remote.options(**options[rank]).remote(rank, num_workers) for rank in range(num_workers)
        ]
        group = cls(spec, actors)
        host, port = ray.get(actors[0].rendezvous.remote())
        try:
            steps = ray.get([a.init.remote(host, port, spec, str(resume_from)) for a in actors])
        except ray.exceptions.RayTaskError as err:
            group.shutdown()
            raise TrainerGroupError(
                f"the trainer group of {num_workers} ranks did not start: {err.cause!r}"
            ) from None
        group.step = steps[0]
        return group

    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        if self.failed:
            raise TrainerGroupError(self.failed)
        self.wait_for_save()
        refs = [ray.put(a) if isinstance(a, (list, tuple)) else a for a in args]
        return self._results(
            method, [getattr(actor, method).remote(*refs) for actor in self.actors]
        )

    def _results(self, method: str, futures: list[Any]) -> list[Any]:
        """Every rank's result, in rank order, as each finishes. The first rank to fail stops
        the group: the others may be waiting for it in a collective and would wait out the
        process group's timeout. Its SparrowError (a TrainerMemoryError, say) comes back as
        itself, anything else as Ray raised it; later calls raise TrainerGroupError."""
        import ray.exceptions

        try:
            return results_failing_fast(
                futures,
                lambda rank, cause, _: self.stop(
                    f"{method} failed on rank {rank}: {first_line(cause)}"
                ),
            )
        except ray.exceptions.RayError as err:
            cause = getattr(err, "cause", None) or err
            if isinstance(cause, SparrowError):
                raise cause from None
            raise

    def stop(self, why: str) -> None:
        """Kill every rank now (one may be waiting in a collective for a party that failed);
        later calls raise TrainerGroupError with `why`, and the flow starts a new group."""
        self.failed = f"the trainer group was stopped after {why}"
        self._kill()

    def _kill(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self._saving = [], []

    def score(self, records):
        return self._all("score", list(records))[0]

    def score_checkpoint(self, folder, records) -> list:
        """`records` scored against the policy saved in `folder`, on rank 0 alone (a
        one-step-off step's stale samples against their own version; the flow's process holds
        none of the group's devices)."""
        if self.failed:
            raise TrainerGroupError(self.failed)
        self.wait_for_save()
        future = self.actors[0].score_checkpoint.remote(str(folder), list(records))
        return self._results("score_checkpoint", [future])[0]

    def update(self, records, rewards, old_logprobs, group_size: int) -> dict[str, float]:
        metrics = self._all(
            "update",
            without_topk(records),
            list(rewards),
            [list(o) for o in old_logprobs],
            group_size,
        )[0]
        self.step += 1
        return metrics

    @property
    def can_offload(self) -> bool:
        return self.device.type == "cuda"

    def free_gradients(self) -> None:
        self._all("free_gradients")

    def rank_seconds(self) -> list[dict[str, float]]:
        """Per rank, seconds of its last score and update calls (TrainerRank.timings)."""
        return self._all("timings")

    def offload(self) -> None:
        """Each rank moves its weight shards and AdamW moments to host memory
        (trainer.offload_during_rollout; ShardedPolicyTrainer.offload). A save still being
        written is waited for first, so the engines see the freed memory when they wake."""
        self._all("offload")

    def onload(self) -> None:
        """The shards back on the ranks' devices (each rank also does this itself before any
        call that needs them)."""
        self._all("onload")

    def save(self, folder) -> str:
        return self._all("save", str(folder))[0]

    def save_in_background(self, folder):
        """The ranks write while the driver goes on (the rollout runs on the engines); the
        next call to the group waits for it first."""
        self._saving = [actor.save.remote(str(folder)) for actor in self.actors]
        return self._saving

    def wait_for_save(self) -> None:
        pending, self._saving = self._saving, []
        if pending:
            self._results("save", pending)

    def info(self) -> list[dict[str, Any]]:
        """Per rank, its number, pid and Ray node (TrainerRank.info)."""
        return self._all("info")

    def export(self, folder) -> str:
        return self._all("export", str(folder))[0]

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
            ray.kill(actor, no_restart=True)
        self.actors = []
