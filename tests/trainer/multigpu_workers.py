"""Rank processes for test_multigpu.py: ShardedPolicyTrainer on NCCL ranks, one GPU each."""

from __future__ import annotations

import torch
import torch.distributed as dist


def update_rank(
    rank,
    world_size,
    port,
    checkpoint,
    algo,
    trainer_config,
    records,
    rewards,
    old,
    group_size,
    out_dir,
):
    from sparrow.trainer.sharded import ShardedPolicyTrainer

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        # fp32 compute, so the two ranks' sum can be held to the one-GPU trainer closely
        trainer = ShardedPolicyTrainer(
            checkpoint, algo, dtype="float32", seed=0, trainer_config=trainer_config
        )
        metrics = trainer.update(records, rewards, old, group_size)
        weights = trainer.full_state_dict()
        if rank == 0:
            torch.save({"metrics": metrics, "weights": weights}, out_dir / "nccl_rank0.pt")
    finally:
        dist.destroy_process_group()
