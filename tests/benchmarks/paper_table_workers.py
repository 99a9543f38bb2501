"""Rank processes for test_paper_table_gpu.py (spawned children import this module by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def shape_rank(
    rank, world_size, port, checkpoint, algo, trainer_config, records, rewards, old, out_dir
):
    """A ShardedPolicyTrainer of one paper size on NCCL ranks, as the group runs it in the
    table: score, update, two offload / onload round trips with an update after each, and
    the sync's packed bf16 weights. Rank 0 saves what the test checks."""
    from sparrow.trainer.sharded import ShardedPolicyTrainer
    from sparrow.trainer.sync_pack import pack_full_weights

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0, trainer_config=trainer_config)
        reserved = trainer.offload_stats()
        scores = trainer.score(records)
        losses = [trainer.update(records, rewards, old, 8)["actor/loss"]]
        cycles = []
        for _ in range(2):
            trainer.free_gradients()
            allocated = torch.cuda.memory_allocated()
            trainer.offload()
            freed = allocated - torch.cuda.memory_allocated()
            trainer.onload()
            cycles.append({**trainer.offload_stats(), "freed": freed})
            losses.append(trainer.update(records, rewards, old, 8)["actor/loss"])
        packed = pack_full_weights(trainer, torch.bfloat16)
        if rank == 0:
            torch.save(
                {
                    "reserved": reserved,
                    "cycles": cycles,
                    "losses": losses,
                    "scored": [len(s.dense_logprobs) for s in scores],
                    "packed_bytes": packed.buffer.numel() * packed.buffer.element_size(),
                },
                out_dir / "shape_rank0.pt",
            )
    finally:
        dist.destroy_process_group()
