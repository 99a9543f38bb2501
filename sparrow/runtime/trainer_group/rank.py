"""One rank of the trainer group: the body of its Ray actor, and what every rank builds.

    rank = TrainerRank(rank=0, world_size=2)       # in a Ray actor (sparrow/runtime/trainer_group/group.py)
    host, port = rank.rendezvous()                 # rank 0's node and a free port there
    rank.init(host, port, TrainerSpec(model_path, algo, config.trainer, device="cuda"))
    rank.score(records); rank.update(records, rewards, old, group_size); rank.save(folder)

A rank holds a ShardedPolicyTrainer (rl/sharded.py, FSDP2) and answers the group's calls; rank
0 alone returns results (every rank computes the same). It gives its cached CUDA blocks back
after an update and when its gradients are dropped, packs the full weights for colocated
engines (CUDA IPC) or sends them in buckets over NCCL (sparrow/runtime/rollout/weight_sync.py drives both),
and takes DistillSparse's calls through DistillRank (sparrow/runtime/trainer_group/distill.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sparrow.runtime.trainer_group.distill import DistillRank


@dataclass(frozen=True)
class TrainerSpec:
    """What each rank builds (plain values, pickled to Ray)."""

    model_path: str
    algo: Any  # AlgoConfig
    trainer_config: Any = None  # TrainerConfig: micro-batches, memory savers; None: defaults
    seed: int = 0
    temperature: float = 1.0
    dtype: str = "auto"  # compute dtype: auto is bf16 on GPU, fp32 on CPU
    device: str = "cpu"  # "cuda": one GPU per rank and NCCL; "cpu": gloo
    threads: int = 1


class TrainerRank(DistillRank):
    """One rank: the body of a Ray actor (a plain class, so it can be read and tested alone);
    DistillSparse's methods come from DistillRank (sparrow/runtime/trainer_group/distill.py)."""

    def __init__(self, rank: int, world_size: int):
        from sparrow.cuda_memory import freeze_actor_heap

        freeze_actor_heap()  # before the trainer: its updates' collections skip the imports
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

    def info(self) -> dict[str, Any]:
        """This rank's number, pid and Ray node (synced.json records them)."""
        import os

        from sparrow.runtime.ray_results import node_id

        return {"rank": self.rank, "pid": os.getpid(), "node_id": node_id()}

    def init(self, host: str, port: int, spec: TrainerSpec, resume_from: str = "") -> int:
        import torch
        import torch.distributed as dist

        from sparrow.trainer.sharded import ShardedPolicyTrainer

        backend = "nccl" if spec.device == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray shows each rank its own GPU as device 0
        else:
            torch.set_num_threads(max(1, spec.threads))
        dist.init_process_group(
            backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size
        )
        if resume_from:
            self.trainer = ShardedPolicyTrainer.load(
                resume_from, spec.algo, spec.dtype, trainer_config=spec.trainer_config
            )
        else:
            self.trainer = ShardedPolicyTrainer(
                spec.model_path,
                spec.algo,
                spec.dtype,
                seed=spec.seed,
                temperature=spec.temperature,
                trainer_config=spec.trainer_config,
            )
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
        from sparrow.cuda_memory import return_cached_blocks

        metrics = self.trainer.update(records, rewards, old_logprobs, group_size)
        # the weight sync and the engines come next on this GPU; the driver's return of its
        # own blocks does not reach this process (at 28 layers the sync's NCCL communicator
        # could not allocate 8 bytes without this)
        return_cached_blocks()
        self.seconds["update"] = time.perf_counter() - clock
        return metrics if self.rank == 0 else None

    def score_checkpoint(self, folder: str, records) -> list:
        """`records` under the dense policy saved in `folder` (a one-step-off step's stale
        samples against their own version, sparrow/trainer/version_scores.py), on this rank's
        device as the trainer scores; one rank alone, not a collective."""
        from sparrow.trainer.version_scores import score_with_checkpoint

        trainer = self.trainer
        return score_with_checkpoint(
            folder,
            records,
            trainer.device,
            trainer.compute_dtype,
            trainer.temperature,
            trainer.trainer_config.micro_batch_tokens,
            trainer.trainer_config.logits_chunk_tokens,
        )

    def timings(self) -> dict[str, float]:
        """Seconds of this rank's last score and update calls (the driver's wall time less
        these is the records' and results' way through Ray)."""
        return dict(self.seconds)

    def free_gradients(self) -> None:
        from sparrow.cuda_memory import return_cached_blocks

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
        from sparrow.engine.weight_share import device_uuid

        return device_uuid()

    # weight sync (sparrow/runtime/rollout/weight_sync.py drives these)

    def gather_for_sync(
        self, engine_dtype: str, share: bool, adapter_path: str = ""
    ) -> dict | None:
        """All ranks gather the full weights into one flat buffer in the engines' dtype on
        rank 0's device (rl/sync_pack.py, a collective; with a DistillSparse adapter folder
        merge(policy, LoRA), in the buffer only: the trainer's shards stay the plain policy).
        Rank 0 keeps it for send_weights and returns {"message": its CUDA IPC message when an
        engine shares this GPU, else None, "bytes", "seconds"}; other ranks return None."""
        import torch

        from sparrow.trainer.lora import Adapter
        from sparrow.trainer.sync_pack import pack_full_weights

        clock = time.perf_counter()
        self.trainer.onload()
        adapter = Adapter.read(adapter_path) if adapter_path else None
        packed = pack_full_weights(self.trainer, getattr(torch, engine_dtype), adapter)
        if self.rank != 0:
            return None
        self._packed = packed
        return {
            "message": packed.message() if share else None,
            "bytes": packed.buffer.numel() * packed.buffer.element_size(),
            "seconds": time.perf_counter() - clock,
        }

    def join_sync(self, host: str, port: int, world_size: int, backend: str) -> None:
        from sparrow.trainer.weight_broadcast import SyncGroup

        if self._sync_group is not None:
            self._sync_group.close()
        self._sync_group = SyncGroup.connect(host, port, 0, world_size, backend)

    def send_weights(self, bucket_bytes: int) -> dict:
        """Broadcast the packed buffer to the sync group's engines: {"bytes", "seconds"}."""
        import torch

        clock = time.perf_counter()
        sent = 0
        if self._sync_group is not None and self._sync_group.world_size > 1:
            sent = self._sync_group.send_packed(
                self._packed.buffer, self._packed.layout, bucket_bytes
            )
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
