"""Rank processes for test_sharded_trainer.py and test_sharded_checkpoint.py (spawned children
import this module by name).

one_rank: each rank joins a gloo group, scores and updates with ShardedPolicyTrainer on the
same batch, exports, and rank 0 saves what the test compares. save_then_update: one update,
save() and export(), then a second update whose result rank 0 saves.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world_size: int, *args, body=None) -> None:
    """body(rank, world_size, port, *args) in world_size spawned processes (one_rank if None)."""
    import torch.multiprocessing as mp

    mp.spawn(body or one_rank, args=(world_size, free_port(), *args), nprocs=world_size,
             join=True)


def _join(rank, world_size, port) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)


def one_rank(rank, world_size, port, checkpoint, algo, records, update_records, rewards, old,
             group_size, out_dir):
    from sparrow_core.rl.sharded import ShardedPolicyTrainer

    _join(rank, world_size, port)
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


def save_then_update(rank, world_size, port, checkpoint, algo, update_records, rewards, old,
                     group_size, out_dir):
    """rewards: two lists, one per update; out_dir gets sharded/ (save), export/ (export)
    after the first update and, from rank 0, continued.pt after the second."""
    from sparrow_core.rl.sharded import ShardedPolicyTrainer

    _join(rank, world_size, port)
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0)
        trainer.update(update_records, rewards[0], old, group_size)
        trainer.save(out_dir / "sharded")
        trainer.export(out_dir / "export")
        trainer.update(update_records, rewards[1], old, group_size)
        weights = trainer.full_state_dict()
        optimizer = trainer.full_optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optimizer": optimizer}, out_dir / "continued.pt")
    finally:
        dist.destroy_process_group()
