"""Checkpoints of ShardedPolicyTrainer: each rank writes its own optimizer shards, and any
number of ranks, or one process without a process group, resumes from them.

    save_sharded(trainer, folder)                          # a collective: every rank calls it
    trainer = ShardedPolicyTrainer.load(folder, algo)      # every rank of the new group
    trainer = PolicyTrainer.load(folder, algo)             # one process (read_full_optimizer)

A folder holds:
    config.json, generation_config.json, model.safetensors   the full fp32 weights, gathered
                                                             on rank 0 (HF safetensors: the
                                                             engine, transformers, load_model)
    tokenizer files, rng_state.pt, trainer_state.json        as rl/checkpoint.py writes them,
                                                             plus "sharded_ranks": N
    sharded_state/                                           the AdamW state as
                                                             torch.distributed.checkpoint
                                                             shards, one file per rank

So no rank gathers the optimizer (twice the weights' size in fp32). Resuming builds the
trainer from model.safetensors, then DCP reads the optimizer shards into the new group's
own sharding, whatever its number of ranks. PolicyTrainer.load (trainer.num_workers=0) reads
them whole in its one process with DCP's no_dist load (no process group) and numbers the
parameters in the model's order, as ShardedPolicyTrainer.full_optimizer_state does. A folder
without sharded_state/ (PolicyTrainer.save, or ShardedPolicyTrainer.export: optimizer.pt
numbered as one process's) resumes on a group too: every rank reads the whole optimizer state
and keeps its shards. The folder is written in a scratch folder that rank 0 renames into
place; the ranks must share a filesystem (one machine, or a network filesystem across
machines).
Tests: tests/runtime/trainer_group/test_group.py (2 ranks saved, 1 resumes, and 1 saved, 2 resume),
tests/trainer/test_sharded_checkpoint.py (2 ranks saved, one process resumes).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sparrow.scratch import scratch_dir
from sparrow.trainer.checkpoint import (
    OPTIMIZER_STATE,
    RNG_STATE,
    SHARDED_STATE,
    TRAINER_STATE,
    TrainerCheckpointError,
    restore_rng_state,
    rng_state,
    write_trainer_files,
)


def _broadcast_path(trainer, path: Path | None) -> Path:
    holder = [str(path) if path is not None else None]
    dist.broadcast_object_list(
        holder,
        src=dist.get_global_rank(trainer.group, 0) if trainer.group is not None else 0,
        group=trainer.group,
    )
    return Path(holder[0])


def save_sharded(trainer, folder: str | Path) -> Path:
    """Write the folder of the module doc (a collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    out = Path(folder)
    scratch = None
    if trainer.rank == 0:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise TrainerCheckpointError(f"checkpoint folder {out} already exists and is not empty")
        scratch = scratch_dir(out)  # makes out's parent too
    scratch = _broadcast_path(trainer, scratch)
    weights = trainer.full_state_dict()
    optimizer = get_optimizer_state_dict(trainer.model, trainer.optimizer)
    dcp.save(
        {"optimizer": optimizer},
        checkpoint_id=str(scratch / SHARDED_STATE),
        process_group=trainer.group,
    )
    if trainer.rank == 0:
        try:
            trainer.model.save_pretrained(scratch, safe_serialization=True, state_dict=weights)
            meta = {**trainer._meta(), "sharded_ranks": trainer.world_size}
            write_trainer_files(scratch, None, rng_state(), trainer.model_path, meta)
            os.replace(scratch, out)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    dist.barrier(group=trainer.group)
    return out


def read_meta(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    for name in (TRAINER_STATE, RNG_STATE, "config.json"):
        if not (folder / name).is_file():
            raise TrainerCheckpointError(
                f"checkpoint folder {folder} has no {name} (not a trainer checkpoint?)"
            )
    if not ((folder / SHARDED_STATE).is_dir() or (folder / OPTIMIZER_STATE).is_file()):
        raise TrainerCheckpointError(
            f"checkpoint folder {folder} has neither {SHARDED_STATE}/ nor {OPTIMIZER_STATE}"
        )
    return json.loads((folder / TRAINER_STATE).read_text())


def restore(trainer, folder: str | Path, meta: dict[str, Any]) -> None:
    """Optimizer state, step counters and RNG from `folder` into a trainer built from it."""
    folder = Path(folder)
    if (folder / SHARDED_STATE).is_dir():
        _restore_shards(trainer, folder / SHARDED_STATE)
    else:
        numbered = torch.load(folder / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
        _restore_full(trainer, numbered)
    for group in trainer.optimizer.param_groups:
        group["lr"], group["weight_decay"] = trainer.algo.lr, trainer.algo.weight_decay
    trainer.step = int(meta["step"])
    trainer.optimizer_steps = int(meta.get("optimizer_steps", 0))
    restore_rng_state(torch.load(folder / RNG_STATE, map_location="cpu", weights_only=True))


def _restore_shards(trainer, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    # the template holds this group's shards (get_ initialises empty AdamW moments)
    state = {"optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer)}
    dcp.load(state, checkpoint_id=str(path), process_group=trainer.group)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, state["optimizer"])


def _restore_full(trainer, numbered: dict[str, Any]) -> None:
    """One process's optimizer.pt (parameters numbered in the model's order), sharded here."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = [name for name, _ in trainer.model.named_parameters()]
    state = {
        "state": {names[int(i)]: s for i, s in numbered["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in numbered["param_groups"]
        ],
    }
    set_optimizer_state_dict(
        trainer.model, trainer.optimizer, state, options=StateDictOptions(full_state_dict=True)
    )


def read_full_optimizer(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The shards under `path` (a folder's sharded_state/) read whole in this process, with no
    process group, as `optimizer`'s state_dict: parameters numbered in `model`'s order (the
    names ShardedPolicyTrainer keys them by), the param groups `optimizer`'s own."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except (OSError, RuntimeError, ValueError, EOFError) as err:
        raise TrainerCheckpointError(f"optimizer shards {path} are unreadable: {err}") from None
    # save_sharded's keys flatten ("optimizer", "state", parameter name, "exp_avg"), ...;
    # planner_data keeps those paths (a parameter name has dots of its own)
    template: dict[str, dict[str, torch.Tensor]] = {}
    for key, where in (metadata.planner_data or {}).items():
        if tuple(where[:2]) == ("optimizer", "state"):
            entry = metadata.state_dict_metadata[key]
            template.setdefault(where[2], {})[where[3]] = torch.empty(
                entry.size, dtype=entry.properties.dtype
            )
    parameters = dict(model.named_parameters())
    misfits = sorted(
        name
        for name, state in template.items()
        if name not in parameters
        or any(t.dim() and t.shape != parameters[name].shape for t in state.values())
    )
    if not template or misfits:
        raise TrainerCheckpointError(
            f"optimizer shards {path} do not fit this model: "
            + (
                f"parameters {misfits[:3]} are not the model's or have other shapes"
                if misfits
                else "they hold no parameter's state"
            )
        )
    try:
        with warnings.catch_warnings():  # the intent is one process; torch warns it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"optimizer": {"state": template}}, checkpoint_id=str(path), no_dist=True)
    except dcp.CheckpointException as err:  # a BaseException: one (exception, trace) per rank
        causes = "; ".join(f"{type(c).__name__}: {c}" for c, _ in err.failures.values())
        raise TrainerCheckpointError(f"optimizer shards {path} are unreadable: {causes}") from None
    number = {name: i for i, name in enumerate(parameters)}
    return {
        "state": {number[name]: state for name, state in template.items()},
        "param_groups": optimizer.state_dict()["param_groups"],
    }
