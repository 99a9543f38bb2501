"""Rank processes for test_sharded_trainer.py (spawned children import this module by name).

Each rank joins a gloo group, scores and updates with ShardedPolicyTrainer on the same batch,
exports, and rank 0 saves what the test compares.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world_size: int, *args) -> None:
    """one_rank(rank, world_size, port, *args) in world_size spawned processes."""
    import torch.multiprocessing as mp

    mp.spawn(one_rank, args=(world_size, free_port(), *args), nprocs=world_size, join=True)


def one_rank(rank, world_size, port, checkpoint, algo, records, update_records, rewards, old,
             group_size, out_dir):
    from sparrow_core.rl.sharded import ShardedPolicyTrainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0)
        scores = trainer.score(records)
        metrics = trainer.update(update_records, rewards, old, group_size)
        weights = trainer.full_state_dict()
        trainer.export(out_dir / "export")
        if rank == 0:
            torch.save({"scores": scores, "metrics": metrics, "weights": weights},
                       out_dir / "rank0.pt")
    finally:
        dist.destroy_process_group()
