"""Rank processes for test_sharded_trainer.py and test_sharded_checkpoint.py (spawned children
import this module by name).

one_rank: each rank joins a gloo group, scores and updates with ShardedPolicyTrainer on the
same batch, exports, and rank 0 saves what the test compares. save_then_update: one update,
save() and export(), then a second update whose result rank 0 saves.
"""

from __future__ import annotations

import faulthandler
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

    mp.spawn(body or one_rank, args=(world_size, free_port(), *args), nprocs=world_size, join=True)


def _join(rank, world_size, port) -> None:
    # a rank that crashes in native code prints where (a SIGSEGV was seen once, 2026-11-29,
    # in test_one_process_resumes_two_ranks_shards on a loaded 2-core machine; not reproduced)
    faulthandler.enable()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )


def _done_together() -> None:
    """Both ranks done before either tears the group down. Without it rank 1 left while rank
    0 was still saving, and once (a loaded 2-core machine) a rank aborted at that point
    ("terminate called without an active exception", SIGABRT); the likeliest cause, not
    proven, is gloo torn down on one side while the other still held the pair open."""
    dist.barrier()


def one_rank(
    rank,
    world_size,
    port,
    checkpoint,
    algo,
    trainer_config,
    records,
    update_records,
    rewards,
    old,
    group_size,
    out_dir,
):
    from sparrow.trainer.sharded import ShardedPolicyTrainer

    _join(rank, world_size, port)
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0, trainer_config=trainer_config)
        scores = trainer.score(records)
        metrics = trainer.update(update_records, rewards, old, group_size)
        weights = trainer.full_state_dict()
        trainer.export(out_dir / "export")
        if rank == 0:
            torch.save(
                {"scores": scores, "metrics": metrics, "weights": weights}, out_dir / "rank0.pt"
            )
        _done_together()
    finally:
        dist.destroy_process_group()


def save_then_update(
    rank,
    world_size,
    port,
    checkpoint,
    algo,
    trainer_config,
    update_records,
    rewards,
    old,
    group_size,
    out_dir,
):
    """rewards: two lists, one per update; out_dir gets sharded/ (save), export/ (export)
    after the first update and, from rank 0, continued.pt after the second."""
    from sparrow.trainer.sharded import ShardedPolicyTrainer

    _join(rank, world_size, port)
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0, trainer_config=trainer_config)
        trainer.update(update_records, rewards[0], old, group_size)
        trainer.save(out_dir / "sharded")
        trainer.export(out_dir / "export")
        trainer.update(update_records, rewards[1], old, group_size)
        weights = trainer.full_state_dict()
        optimizer = trainer.full_optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optimizer": optimizer}, out_dir / "continued.pt")
        _done_together()
    finally:
        dist.destroy_process_group()


def offload_round_trip(
    rank,
    world_size,
    port,
    checkpoint,
    algo,
    trainer_config,
    update_records,
    rewards,
    old,
    group_size,
    out_dir,
    backend="gloo",
):
    """Two trainers, three updates each; one offloads and onloads its shards after the first
    and after the second. Rank 0 saves both ends (weights, optimizer), where the shards lived
    in the first round trip, and per round trip the host buffer's allocations and address."""
    from sparrow.trainer.sharded import ShardedPolicyTrainer

    if backend == "nccl":
        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
    else:
        _join(rank, world_size, port)
    try:
        ends, pointers, memory, cycles = {}, {}, {}, []
        for name in ("plain", "offloaded"):
            trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0, trainer_config=trainer_config)
            for k, reward in enumerate(rewards):
                trainer.update(update_records, reward, old, group_size)
                if name == "offloaded" and k == 0:
                    pointers["before"] = _local_pointers(trainer)
                    memory["before"] = _allocated()
                    memory["shard_bytes"] = sum(
                        t.numel() * t.element_size() for t in _local_tensors(trainer)
                    )
                if name == "offloaded" and k < len(rewards) - 1:
                    trainer.offload()
                    stash = trainer._stash
                    cycles.append(
                        {
                            "allocations": stash.allocations,
                            "buffer": stash.buffer.data_ptr(),
                            "held": all(stash.holds(t) for t in _local_tensors(trainer)),
                        }
                    )
                    if k == 0:
                        pointers["offloaded"] = _local_pointers(trainer)
                        memory["offloaded"] = _allocated()
                        devices = {t.device.type for t in _local_tensors(trainer)}
                    trainer.onload()
                    if k == 0:
                        pointers["onloaded"] = _local_pointers(trainer)
                        pointers["offloaded_devices"] = sorted(devices)
            ends[name] = {
                "weights": trainer.full_state_dict(),
                "optimizer": trainer.full_optimizer_state(),
            }
            del trainer
        if rank == 0:
            torch.save(
                {"ends": ends, "pointers": pointers, "memory": memory, "cycles": cycles},
                out_dir / "offload.pt",
            )
        _done_together()
    finally:
        dist.destroy_process_group()


def _local_tensors(trainer) -> list:
    """This rank's parameter shards and AdamW moments (local tensors)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in trainer.model.parameters()]
    for state in trainer.optimizer.state.values():
        local += [
            v.to_local() if hasattr(v, "to_local") else v
            for v in state.values()
            if torch.is_tensor(v) and v.dim() > 0
        ]
    return local


def _local_pointers(trainer) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in _local_tensors(trainer)]


def _allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def distill_rank(
    rank, world_size, port, model_path, algo, trainer_config, records, schedule, out_dir
):
    """ShardedDistiller over a ShardedPolicyTrainer's base: one step, save, then a second step
    by a distiller loaded from the folder. Rank 0 saves metrics and LoRA after each step; every
    rank saves its LoRA after the first (they must agree)."""
    from sparrow.trainer.lora import adapter_state
    from sparrow.trainer.sharded import ShardedPolicyTrainer
    from sparrow.trainer.sharded_distill import ShardedDistiller

    _join(rank, world_size, port)
    try:
        trainer = ShardedPolicyTrainer(model_path, algo, seed=0, trainer_config=trainer_config)
        distiller = ShardedDistiller(
            model_path, algo, "cpu", "float32", 0, trainer_config=trainer_config
        )
        distiller.set_base_from(trainer)
        first = distiller.distill(records, schedule)
        torch.save(adapter_state(distiller.model), out_dir / f"lora{rank}.pt")
        distiller.save(out_dir / "distill")
        dist.barrier()
        distiller.release_base()
        resumed = ShardedDistiller.load(
            out_dir / "distill", model_path, algo, "cpu", "float32", trainer_config=trainer_config
        )
        resumed.set_base_from(trainer)
        second = resumed.distill(records, schedule)
        if rank == 0:
            torch.save(
                {
                    "first": first,
                    "second": second,
                    "bin_stats": resumed.bin_stats,
                    "lora": adapter_state(resumed.model),
                },
                out_dir / "distill0.pt",
            )
        _done_together()
    finally:
        dist.destroy_process_group()


def pack_rank(rank, world_size, port, checkpoint, algo, adapter, out_dir):
    """rl/sync_pack.py on each rank: the plain fp32 and bf16 packs and, with `adapter`, the
    merged one; rank 0 saves them beside the gathered full state."""
    from sparrow.trainer.sharded import ShardedPolicyTrainer
    from sparrow.trainer.sync_pack import pack_full_weights

    _join(rank, world_size, port)
    try:
        trainer = ShardedPolicyTrainer(checkpoint, algo, seed=0)
        full = trainer.full_state_dict()
        packs = {
            key: pack_full_weights(trainer, dtype, merge)
            for key, dtype, merge in (
                ("fp32", torch.float32, None),
                ("bf16", torch.bfloat16, None),
                ("merged", torch.float32, adapter),
            )
        }
        if rank == 0:
            torch.save(
                {"full": full, "packs": {k: (p.buffer, p.layout) for k, p in packs.items()}},
                out_dir / "packs.pt",
            )
        else:
            assert all(p is None for p in packs.values())
        _done_together()
    finally:
        dist.destroy_process_group()


def wrap_host_views(rank, world_size, port, out_dir):
    """A shard rebuilt around a host view by sharded_offload._around while its mesh names
    a GPU (the mesh's device type set to "cuda" after the group is built, as an NCCL rank's
    would be): rank 0 saves whether the result wraps the view itself, where it lies."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from sparrow.trainer.sharded_offload import _around

    _join(rank, world_size, port)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        shard = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        host = shard.to_local().clone()
        mesh._device_type = "cuda"  # what device_type reads (torch 2.13)
        try:
            wrapped = _around(shard, host)
            got = {
                "same_storage": wrapped.to_local().data_ptr() == host.data_ptr(),
                "device": wrapped.to_local().device.type,
                "shape": tuple(wrapped.shape),
                "placements": wrapped.placements == shard.placements,
            }
        except Exception as error:  # the mesh's device is not there: a copy was attempted
            got = {"error": repr(error)}
        finally:
            mesh._device_type = "cpu"
        if rank == 0:
            torch.save(got, out_dir / "wrapped.pt")
        _done_together()
    finally:
        dist.destroy_process_group()
