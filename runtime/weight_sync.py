"""Weights from a trainer group (runtime/trainer_group.py) to every rollout actor.

    modes = sync_group_to_pool(group, pool, weights_path, bucket_bytes)   # per actor:
                                                                          # "ipc", "nccl", "gloo"
    sync_group_to_pool(group, pool, weights_path, bucket_bytes, adapter_path)   # DistillSparse

The trainer ranks gather the full weights onto rank 0 (a collective). An actor on rank 0's own
GPU (colocated placement) copies them through CUDA IPC (engine/weight_share.py); every other
actor receives rank 0's bucketed broadcast (rl/weight_broadcast.py: NCCL between GPUs, gloo on
CPU). The sync group (rank 0 plus those actors) is built on the first sync and again whenever
the actors change (a replaced actor). `weights_path` is the folder the same weights are saved
in: what a replacement actor starts from. With a DistillSparse adapter folder, rank 0 merges
the LoRA into what it sends (runtime/group_distill.py), and a replacement actor merges the
folder's adapter into the policy folder's weights as it reads them.
Tests: tests/runtime/test_trainer_group.py (gloo); tests/sparrow_core/rl/test_multigpu.py (NCCL).
"""

from __future__ import annotations

from dataclasses import replace


def _connect(group, pool, members: list[int], backend: str) -> None:
    import ray

    rank0 = group.actors[0]
    host, port = ray.get(rank0.rendezvous.remote())
    world = 1 + len(members)
    futures = [rank0.join_sync.remote(host, port, world, backend)]
    futures += [pool.actors[i].join_sync.remote(host, port, k + 1, world, backend)
                for k, i in enumerate(members)]
    ray.get(futures)


def sync_group_to_pool(group, pool, weights_path: str, bucket_bytes: int,
                       adapter_path: str = "") -> list[str]:
    import ray

    backend = "nccl" if group.spec.device == "cuda" else "gloo"
    group.wait_for_save()
    trainer_uuid = ray.get(group.actors[0].device_uuid.remote())
    engine_uuids = pool._call_each("device_uuid")  # a dead actor is replaced here
    shared = [i for i, uuid in enumerate(engine_uuids) if uuid and uuid == trainer_uuid]
    members = [i for i in range(len(pool.actors)) if i not in shared]
    key = tuple(actor._actor_id.hex() for actor in pool.actors)
    if group.sync_key != key:
        _connect(group, pool, members, backend)
        group.sync_key = key
    dtype = pool.spec.dtype
    message = ray.get([a.gather_for_sync.remote(dtype, bool(shared), str(adapter_path))
                       for a in group.actors])[0]
    futures = [group.actors[0].send_weights.remote(dtype, bucket_bytes)]
    futures += [pool.actors[i].receive_weights.remote(str(weights_path)) for i in members]
    futures += [pool.actors[i].load_shared.remote(message, str(weights_path), str(adapter_path))
                for i in shared]
    try:
        ray.get(futures)
    finally:
        ray.get(group.actors[0].release_sync.remote())
    pool.spec = replace(pool.spec, weights_path=str(weights_path),
                        adapter_path=str(adapter_path))
    return ["ipc" if i in shared else backend for i in range(len(pool.actors))]
