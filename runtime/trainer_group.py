"""The trainer as a group of Ray actors: ShardedPolicyTrainer (FSDP2) on N ranks, driven like
one PolicyTrainer.

    group = TrainerGroup.start(TrainerSpec(model_path, algo, seed=0), num_workers=2)
    group = TrainerGroup.start(spec, 2, resume_from=folder)    # saved by any N, or one process
    scores = group.score(records)                              # as PolicyTrainer.score
    metrics = group.update(records, rewards, old, group_size=8)
    group.save(folder)                 # HF safetensors + optimizer shards (rl/sharded_checkpoint.py)
    modes = sync_group_to_pool(group, pool, folder, bucket_bytes)   # runtime/weight_sync.py
    group.shutdown()

Each rank is an actor (one GPU each, or one CPU with gloo); rank 0's node and a free port there
make the rendezvous of torch.distributed. Every call goes to all ranks at once with the same
arguments (the records travel once, through Ray's object store); results come from rank 0,
since ShardedPolicyTrainer gives every rank the same scores and metrics. `placement` gives
each rank's Ray options (runtime/placement.py: a GPU bundle shared with a rollout engine).
A folder the group saved also resumes in one process (PolicyTrainer.load, the train flow's
trainer.num_workers=0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from runtime.group_distill import DistillRank
from sparrow_core.errors import SparrowError


def without_topk(records: Sequence[Any]) -> list[Any]:
    """The records as the update reads them: the actor's top-K (read by scoring only, 20
    values per token) left out as [tokens, 0] arrays, so every rank's copy through Ray's
    object store is that much smaller."""
    from dataclasses import replace

    import numpy as np

    return [replace(r, topk_ids=np.zeros((len(r.output_ids), 0), np.int32),
                    topk_logprobs=np.zeros((len(r.output_ids), 0), np.float32))
            for r in records]


class TrainerGroupError(SparrowError):
    """The trainer group could not start, or was stopped when a rank failed (the message
    names the rank and the cause)."""


@dataclass(frozen=True)
class TrainerSpec:
    """What each rank builds (plain values, pickled to Ray)."""

    model_path: str
    algo: Any  # AlgoConfig
    seed: int = 0
    temperature: float = 1.0
    dtype: str = "auto"  # compute dtype: auto is bf16 on GPU, fp32 on CPU
    device: str = "cpu"  # "cuda": one GPU per rank and NCCL; "cpu": gloo
    threads: int = 1



class TrainerRank(DistillRank):
    """One rank: the body of a Ray actor (a plain class, so it can be read and tested alone);
    DistillSparse's methods come from DistillRank (runtime/group_distill.py)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.trainer = None
        self._packed = None  # rank 0: the weights packed for the engines during a sync
        self.seconds: dict[str, float] = {}
        self._sync_group = None
        self.distiller = None

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0 hosts the group's store)."""
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init(self, host: str, port: int, spec: TrainerSpec, resume_from: str = "") -> int:
        import torch
        import torch.distributed as dist

        from sparrow_core.rl.sharded import ShardedPolicyTrainer

        backend = "nccl" if spec.device == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray shows each rank its own GPU as device 0
        else:
            torch.set_num_threads(max(1, spec.threads))
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size)
        if resume_from:
            self.trainer = ShardedPolicyTrainer.load(resume_from, spec.algo, spec.dtype)
        else:
            self.trainer = ShardedPolicyTrainer(spec.model_path, spec.algo, spec.dtype,
                                                seed=spec.seed, temperature=spec.temperature)
        return self.trainer.step

    def score(self, records) -> list | None:
        clock = time.perf_counter()
        self.trainer.onload()
        scores = self.trainer.score(records)
        self.seconds["score"] = time.perf_counter() - clock
        return scores if self.rank == 0 else None

    def update(self, records, rewards, old_logprobs, group_size: int) -> dict | None:
        clock = time.perf_counter()
        self.trainer.onload()
        from sparrow_core.cuda_memory import return_cached_blocks

        metrics = self.trainer.update(records, rewards, old_logprobs, group_size)
        # the weight sync and the engines come next on this GPU; the driver's return of its
        # own blocks does not reach this process (at 28 layers the sync's NCCL communicator
        # could not allocate 8 bytes without this)
        return_cached_blocks()
        self.seconds["update"] = time.perf_counter() - clock
        return metrics if self.rank == 0 else None

    def timings(self) -> dict[str, float]:
        """Seconds of this rank's last score and update calls (the driver's wall time less
        these is the records' and results' way through Ray)."""
        return dict(self.seconds)

    def free_gradients(self) -> None:
        from sparrow_core.cuda_memory import return_cached_blocks

        self.trainer.free_gradients()
        return_cached_blocks()

    def save(self, folder: str) -> str:
        self.trainer.onload()
        return str(self.trainer.save(folder))

    def export(self, folder: str) -> str:
        self.trainer.onload()
        return str(self.trainer.export(folder))

    def offload(self) -> None:
        self.trainer.offload()

    def onload(self) -> None:
        self.trainer.onload()

    def device_uuid(self) -> str:
        from sparrow_core.engine.weight_share import device_uuid

        return device_uuid()

    # weight sync (runtime/weight_sync.py drives these)

    def gather_for_sync(self, engine_dtype: str, share: bool,
                        adapter_path: str = "") -> dict | None:
        """All ranks gather the full weights into one flat buffer in the engines' dtype on
        rank 0's device (rl/sync_pack.py, a collective; with a DistillSparse adapter folder
        merge(policy, LoRA), in the buffer only: the trainer's shards stay the plain policy).
        Rank 0 keeps it for send_weights and returns {"message": its CUDA IPC message when an
        engine shares this GPU, else None, "bytes", "seconds"}; other ranks return None."""
        import torch

        from sparrow_core.rl.lora import Adapter
        from sparrow_core.rl.sync_pack import pack_full_weights

        clock = time.perf_counter()
        self.trainer.onload()
        adapter = Adapter.read(adapter_path) if adapter_path else None
        packed = pack_full_weights(self.trainer, getattr(torch, engine_dtype), adapter)
        if self.rank != 0:
            return None
        self._packed = packed
        return {"message": packed.message() if share else None,
                "bytes": packed.buffer.numel() * packed.buffer.element_size(),
                "seconds": time.perf_counter() - clock}

    def join_sync(self, host: str, port: int, world_size: int, backend: str) -> None:
        from sparrow_core.rl.weight_broadcast import SyncGroup

        if self._sync_group is not None:
            self._sync_group.close()
        self._sync_group = SyncGroup.connect(host, port, 0, world_size, backend)

    def send_weights(self, bucket_bytes: int) -> dict:
        """Broadcast the packed buffer to the sync group's engines: {"bytes", "seconds"}."""
        import torch

        clock = time.perf_counter()
        sent = 0
        if self._sync_group is not None and self._sync_group.world_size > 1:
            sent = self._sync_group.send_packed(self._packed.buffer, self._packed.layout,
                                                bucket_bytes)
            if self._packed.buffer.is_cuda:  # NCCL's wait() does not block the host
                torch.cuda.synchronize()
        return {"bytes": sent, "seconds": time.perf_counter() - clock}

    def release_sync(self) -> None:
        if self._packed is not None:
            self._packed.close()
            self._packed = None

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self._sync_group is not None:
            self._sync_group.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerGroup:
    """N TrainerRank actors (see the module doc)."""

    def __init__(self, spec: TrainerSpec, actors: list[Any]):
        import torch

        self.spec, self.actors = spec, actors
        self.device = torch.device(spec.device)
        self.step = 0
        self.sync_key: tuple = ()  # the engines the sync group was built for
        self.last_sync: dict = {}  # the last sync's phases (runtime/weight_sync.py)
        self._saving: list = []
        self.failed = ""  # why the group was stopped, once a rank failed

    @classmethod
    def start(cls, spec: TrainerSpec, num_workers: int, placement: Sequence[dict] | None = None,
              resume_from: str = "") -> "TrainerGroup":
        import ray
        import ray.exceptions

        default = {"num_gpus": 1, "num_cpus": 1} if spec.device == "cuda" \
            else {"num_cpus": max(1, spec.threads)}
        options = list(placement) if placement else [default] * num_workers
        remote = ray.remote(max_restarts=0, max_task_retries=0)(TrainerRank)
        actors = [remote.options(**options[rank]).remote(rank, num_workers)
                  for rank in range(num_workers)]
        group = cls(spec, actors)
        host, port = ray.get(actors[0].rendezvous.remote())
        try:
            steps = ray.get([a.init.remote(host, port, spec, str(resume_from)) for a in actors])
        except ray.exceptions.RayTaskError as err:
            group.shutdown()
            raise TrainerGroupError(f"the trainer group of {num_workers} ranks did not start: "
                                    f"{err.cause!r}") from None
        group.step = steps[0]
        return group

    def _all(self, method: str, *args: Any) -> list[Any]:
        import ray

        if self.failed:
            raise TrainerGroupError(self.failed)
        self.wait_for_save()
        refs = [ray.put(a) if isinstance(a, (list, tuple)) else a for a in args]
        return self._results(method, [getattr(actor, method).remote(*refs)
                                      for actor in self.actors])

    def _results(self, method: str, futures: list[Any]) -> list[Any]:
        """Every rank's result, in rank order, as each finishes. The first rank to fail stops
        the group: the others may be waiting for it in a collective and would wait out the
        process group's timeout. Its SparrowError (a TrainerMemoryError, say) comes back as
        itself, anything else as Ray raised it; later calls raise TrainerGroupError."""
        import ray
        import ray.exceptions

        results: dict[Any, Any] = {}
        pending = list(futures)
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            try:
                results[done] = ray.get(done)
            except ray.exceptions.RayError as err:
                cause = getattr(err, "cause", None) or err
                self.failed = (f"the trainer group was stopped after {method} failed on rank "
                               f"{futures.index(done)}: {str(cause).splitlines()[0]}")
                self._kill()
                if isinstance(cause, SparrowError):
                    raise cause from None
                raise
        return [results[future] for future in futures]

    def _kill(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self._saving = [], []

    def score(self, records):
        return self._all("score", list(records))[0]

    def update(self, records, rewards, old_logprobs, group_size: int) -> dict[str, float]:
        metrics = self._all("update", without_topk(records), list(rewards),
                            [list(o) for o in old_logprobs], group_size)[0]
        self.step += 1
        return metrics

    def free_gradients(self) -> None:
        self._all("free_gradients")

    def rank_seconds(self) -> list[dict[str, float]]:
        """Per rank, seconds of its last score and update calls (TrainerRank.timings)."""
        return self._all("timings")

    def offload(self) -> None:
        """Each rank moves its weight shards and AdamW moments to host memory
        (algo.offload_during_rollout; ShardedPolicyTrainer.offload). A save still being
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

