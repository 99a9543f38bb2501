"""Weights from a trainer group (sparrow/runtime/trainer_group/group.py) to every rollout actor.

    modes = sync_group_to_pool(group, pool, weights_path, bucket_bytes)   # per actor:
                                                                          # "ipc", "nccl", "gloo"
    sync_group_to_pool(group, pool, weights_path, bucket_bytes, adapter_path)   # DistillSparse

The trainer ranks gather the full weights onto rank 0 (a collective). An actor on rank 0's own
GPU (colocated placement) copies them through CUDA IPC (engine/weight_share.py); every other
actor receives rank 0's bucketed broadcast (rl/weight_broadcast.py: NCCL between GPUs, gloo on
CPU). The sync group (rank 0 plus those actors) is built on the first sync and again whenever
the actors change (a replaced actor). `weights_path` is the folder the same weights are saved
in: what a replacement actor starts from. With a DistillSparse adapter folder, rank 0 merges
the LoRA into what it sends (sparrow/runtime/trainer_group/distill.py), and a replacement actor merges the
folder's adapter into the policy folder's weights as it reads them.
The ranks gather into one flat buffer in the engines' dtype on rank 0's device
(rl/sync_pack.py): the IPC engine maps that buffer, and the broadcast sends slices of it, so
the weights never pass through host memory. group.last_sync holds the last sync's phases in
seconds: connect_s (device uuids, and the sync group when the actors changed), gather_s
(the ranks' gather and pack; pack_s is rank 0's own time in it), transfer_s (the broadcast and
the IPC copies until every engine has its weights; send_s is rank 0's), and per engine
{mode, seconds, load_s (its copies into the engine)}. A party that fails while others wait
in the broadcast stops the group and the engines waiting at once (`transfer`); the sync
stage's retry then loads the policy folder (RunRuntime.trainer_after gives no stopped group).
Tests: tests/runtime/trainer_group/test_group.py (gloo); tests/trainer/test_multigpu.py (NCCL).
"""

from __future__ import annotations

import time
from dataclasses import replace

from sparrow.runtime.ray_results import first_line, results_failing_fast


def _connect(group, pool, members: list[int], backend: str) -> None:
    import ray

    rank0 = group.actors[0]
    host, port = ray.get(rank0.rendezvous.remote())
    world = 1 + len(members)
    futures = [rank0.join_sync.remote(host, port, world, backend)]
    futures += [
        pool.actors[i].join_sync.remote(host, port, k + 1, world, backend)
        for k, i in enumerate(members)
    ]
    ray.get(futures)


def sync_group_to_pool(
    group, pool, weights_path: str, bucket_bytes: int, adapter_path: str = ""
) -> list[str]:
    """See the module doc; the phases' seconds are left in group.last_sync."""
    import ray

    times: dict = {}
    clock = time.perf_counter()
    backend = "nccl" if group.spec.device == "cuda" else "gloo"
    group.wait_for_save()
    trainer_uuid = ray.get(group.actors[0].device_uuid.remote())
    engine_uuids = pool.device_uuids()  # a dead actor is replaced here
    shared = [i for i, uuid in enumerate(engine_uuids) if uuid and uuid == trainer_uuid]
    members = [i for i in range(len(pool.actors)) if i not in shared]
    key = tuple(actor._actor_id.hex() for actor in pool.actors)
    if group.sync_key != key:
        _connect(group, pool, members, backend)
        group.sync_key = key
    times["connect_s"] = _lap(times, clock)
    dtype = pool.spec.dtype
    packed = ray.get(
        [a.gather_for_sync.remote(dtype, bool(shared), str(adapter_path)) for a in group.actors]
    )[0]
    times["gather_s"] = _lap(times, clock)
    futures = [group.actors[0].send_weights.remote(bucket_bytes)]
    futures += [pool.actors[i].receive_weights.remote(str(weights_path)) for i in members]
    futures += [
        pool.actors[i].copy_shared.remote(packed["message"], str(weights_path), str(adapter_path))
        for i in shared
    ]
    done = transfer(group, [group.actors[0]] + [pool.actors[i] for i in members + shared], futures)
    ray.get(group.actors[0].release_sync.remote())
    times["transfer_s"] = _lap(times, clock)
    engines = dict(zip(members + shared, done[1:]))
    group.last_sync = {
        **times,
        "seconds": time.perf_counter() - clock,
        "packed_bytes": packed["bytes"],
        "pack_s": packed["seconds"],
        "send_s": done[0]["seconds"],
        "sent_bytes": done[0]["bytes"],
        "engines": [engines[i] for i in range(len(pool.actors))],
    }
    pool.spec = replace(pool.spec, weights_path=str(weights_path), adapter_path=str(adapter_path))
    return ["ipc" if i in shared else backend for i in range(len(pool.actors))]


def transfer(group, parties: list, futures: list) -> list:
    """Every party's result (rank 0's send, each engine's receive or copy), taken as each
    comes. A party that fails while others still run would leave them in the broadcast until
    the sync group's timeout (10 minutes; NCCL does not notice a dead peer sooner): the
    trainer group is stopped, the engines still waiting are killed (the pool replaces them
    from the policy folder at its next call), and the failure raised."""
    import ray

    def stop_the_waiting(index: int, cause: BaseException, waiting: list) -> None:
        if not waiting:
            return
        who = "rank 0" if index == 0 else f"engine {index - 1} of the sync"
        group.stop(f"the weight sync failed on {who}: {first_line(cause)}")
        for future in waiting:
            if futures.index(future) > 0:
                ray.kill(parties[futures.index(future)], no_restart=True)

    return results_failing_fast(futures, stop_the_waiting)


def _lap(times: dict, clock: float) -> float:
    """Seconds since `clock` not yet given to an earlier phase in `times`."""
    return time.perf_counter() - clock - sum(times.values())
