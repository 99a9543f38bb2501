"""Stage 7, sync_weights: every rollout actor loads the updated policy from its folder.

    outcome = sync_weights_task(workdir, run_id, step, policy_dir)   # .../sync_weights/synced.json
    sync_weights_task(workdir, run_id, step, policy_dir, adapter_dir)   # DistillSparse

Weights travel by path: each actor reads the safetensors of the policy_update folder itself
(ActorPool.load_weights), nothing is shipped through the flow. An actor found dead is
replaced by one built from that folder. synced.json records the folder and each actor's
process, Ray node and weights (with a trainer group, each rank's process and node too). With an adapter folder (the distill_lora stage's), the engines get
merge(policy, LoRA) (sparrow/trainer/lora.py), computed in fp32 from the fp32 policy: by the
trainer before packing the CUDA IPC buffer, or by each actor as it reads the policy folder.
The trainer keeps the plain policy. One-step-off (docs/async.md): a rollout in flight (the next
step's, from the previous weights) is waited for first; the engines then hold this step's
version (runtime.engine_version).
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from sparrow.runtime.ledger import contract
from sparrow.runtime.ledger.stage import StageInputError, StageOutcome, StageWrite, run_stage
from sparrow.runtime.retry import INFRA_RETRIES
from sparrow.runtime.rollout.in_flight import settle_rollout
from sparrow.runtime.run_runtime import RunRuntime, lookup


def sync(
    runtime: RunRuntime, step: int, policy_dir: str, out: Path, adapter_dir: str = ""
) -> StageWrite:
    settle_rollout(runtime)  # one-step-off: the next step's rollout holds the engines
    clock = time.perf_counter()
    trainer = runtime.trainer_after(step)
    runtime.engine_version = -1  # unknown until the load below is through
    if trainer is not None and trainer.sharded:
        write = _sync_group(runtime, trainer, policy_dir, out, clock, adapter_dir)
        runtime.engine_version = step
        return write
    colocated = _colocated(runtime, trainer)
    # GPU to GPU needs no file: the state may still be being written (a replacement actor
    # reads it later); a folder sync, or an engine on another GPU of the host, waits for it
    policy_dir = str(runtime.policy_state(policy_dir, wait=folder_needed(runtime, trainer)))
    if not colocated and not (Path(policy_dir) / "config.json").is_file():
        raise StageInputError(f"policy folder {policy_dir} holds no checkpoint (config.json)")
    if colocated:
        # colocated: the engines copy the trainer's weights GPU to GPU (CUDA IPC)
        shared = (
            trainer.shared_weights(_engine_dtype(runtime))
            if not adapter_dir
            else _merged_shared(trainer, adapter_dir, _engine_dtype(runtime))
        )
        try:
            modes = runtime.pool.load_shared(shared.message(), policy_dir, adapter_dir)
        finally:
            shared.close()
    else:
        runtime.pool.load_weights(policy_dir, adapter_dir)
        modes = ["folder"] * len(runtime.pool.actors)
    runtime.engine_version = step
    seconds = time.perf_counter() - clock
    contract.write_json(
        contract.SYNCED.under(out),
        {
            "weights_path": policy_dir,
            "adapter_path": adapter_dir,
            "modes": modes,
            "seconds": seconds,
            "actors": runtime.pool.info(),
        },
    )
    return StageWrite(
        metrics={
            "sync/actors": float(len(modes)),
            "time/sync_copy_s": seconds,
            "sync/ipc_actors": float(modes.count("ipc")),
        }
    )


def _colocated(runtime: RunRuntime, trainer) -> bool:
    """A CUDA trainer in this process beside GPU engines: CUDA IPC for those on its GPU."""
    return trainer is not None and runtime.pool_on_gpu and trainer.device.type == "cuda"


def folder_needed(runtime: RunRuntime, trainer) -> bool:
    """Whether some engine reads this step's policy folder: every engine does without a
    colocated CUDA trainer; with one, each engine on another GPU of the host (one trainer
    process on cuda:0, an actor per GPU) reads it while the trainer's GPU gets CUDA IPC."""
    if not _colocated(runtime, trainer):
        return True
    from sparrow.engine.weight_share import device_uuid

    mine = device_uuid(trainer.device.index)
    return any(uuid != mine for uuid in runtime.pool.device_uuids())


def _sync_group(
    runtime: RunRuntime, group, policy_dir: str, out: Path, clock: float, adapter_dir: str = ""
) -> StageWrite:
    """A trainer group's weights (merged with the adapter, if any, on rank 0) to every actor:
    CUDA IPC on rank 0's GPU, a bucketed broadcast to the others (sparrow/runtime/rollout/weight_sync.py);
    the folders are what replacements load. synced.json's phases: the sync's breakdown."""
    from sparrow.runtime.rollout.weight_sync import sync_group_to_pool

    policy_dir = str(runtime.policy_state(policy_dir, wait=False))
    modes = sync_group_to_pool(
        group, runtime.pool, policy_dir, runtime.cfg.trainer.sync_bucket_mib << 20, adapter_dir
    )
    seconds = time.perf_counter() - clock
    phases = dict(group.last_sync)
    contract.write_json(
        contract.SYNCED.under(out),
        {
            "weights_path": policy_dir,
            "adapter_path": adapter_dir,
            "modes": modes,
            "seconds": seconds,
            "phases": phases,
            "actors": runtime.pool.info(),
            "ranks": group.info(),
        },
    )
    return StageWrite(
        metrics={
            "sync/actors": float(len(modes)),
            "time/sync_copy_s": seconds,
            "time/sync_gather_s": float(phases.get("gather_s", 0.0)),
            "time/sync_transfer_s": float(phases.get("transfer_s", 0.0)),
            "sync/ipc_actors": float(modes.count("ipc")),
        }
    )


def _merged_shared(trainer, adapter_dir: str, dtype):
    """The trainer's weights with the LoRA merged, packed for colocated engines."""
    from sparrow.engine.weight_share import SharedWeights
    from sparrow.trainer.lora import Adapter, merged_for_engine

    trainer.onload()
    state = merged_for_engine(trainer.state_dict_for_sync(), Adapter.read(adapter_dir), dtype)
    return SharedWeights.pack(state, dtype)


def _engine_dtype(runtime: RunRuntime):
    import torch

    return getattr(torch, runtime.pool.spec.dtype)


@task(name="sync_weights", cache_policy=NONE, **INFRA_RETRIES)
def sync_weights_task(
    workdir: str, run_id: str, step: int, policy_dir: str, adapter_dir: str = ""
) -> StageOutcome:
    runtime = lookup(workdir, run_id)
    return run_stage(
        runtime, "sync_weights", step, lambda out: sync(runtime, step, policy_dir, out, adapter_dir)
    )
