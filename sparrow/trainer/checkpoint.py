"""Trainer checkpoints on disk: a loadable Hugging Face folder plus optimizer and RNG state.

    save_checkpoint(out_dir, model, optimizer, tokenizer_source, {"step": 3, ...})
    state = read_checkpoint_state(out_dir)     # CheckpointState(meta, optimizer, rng)

Layout of a checkpoint folder:
    config.json, generation_config.json, model.safetensors   (model.save_pretrained)
    tokenizer.json, tokenizer_config.json, ...                (copied from the source model)
    optimizer.pt        torch.save of the optimizer's state_dict (a trainer group's folder
                        has sharded_state/ instead: rl/sharded_checkpoint.py)
    rng_state.pt        torch CPU (and CUDA) generator states
    trainer_state.json  step, optimizer steps, seed, algo settings, dtype

So the folder is itself a checkpoint the engine (sparrow.model.load_model), transformers
and the trainer all load. It is written in a scratch folder beside out_dir and renamed into
place, so a crash leaves no half checkpoint; an existing non-empty out_dir is refused. A full
disk is DiskFullError naming out_dir and the bytes the state needs (torch's own error there
is "unexpected pos", which does not say so).
Weights are saved in the dtype the trainer holds them (fp32 master weights), so a resumed run
continues bit for bit.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sparrow.errors import SparrowError, disk_full_error, is_disk_full
from sparrow.scratch import scratch_dir

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.pt"
SHARDED_STATE = "sharded_state"  # a trainer group's AdamW shards (rl/sharded_checkpoint.py)
RNG_STATE = "rng_state.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
FORMAT_VERSION = 1


class TrainerCheckpointError(SparrowError):
    """A trainer checkpoint that cannot be written or read; the message names the path."""


@dataclass(frozen=True)
class CheckpointState:
    meta: dict[str, Any]  # the trainer_state.json contents
    # the optimizer's state_dict; None: the folder holds SHARDED_STATE/ instead
    optimizer: dict[str, Any] | None
    rng: dict[str, Any]  # generator states (see rng_state)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tokenizer_source: str | Path,
    meta: dict[str, Any],
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint folder (see the module doc); returns out_dir. state_dict and
    optimizer_state replace the model's and optimizer's own (rl/sharded.py: gathered ones)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainerCheckpointError(f"checkpoint folder {out} already exists and is not empty")
    scratch = scratch_dir(out)  # makes out's parent too
    try:
        model.save_pretrained(scratch, safe_serialization=True, state_dict=state_dict)
        if optimizer_state is None:
            optimizer_state = optimizer.state_dict()
        write_trainer_files(scratch, optimizer_state, rng_state(), tokenizer_source, meta)
        os.replace(scratch, out)
    except Exception as err:
        if is_disk_full(err, out.parent):
            weights = state_dict if state_dict is not None else model.state_dict()
            raise disk_full_error(out, tensor_bytes([weights, optimizer_state])) from None
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def tensor_bytes(state: Any) -> int:
    """The bytes of every tensor in nested dicts and lists (what a checkpoint of it needs)."""
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def write_trainer_files(
    folder: Path,
    optimizer_state: dict[str, Any] | None,
    rng: dict[str, Any],
    tokenizer_source: str | Path,
    meta: dict[str, Any],
) -> None:
    """Everything of a checkpoint folder but the model's weights and config (optimizer_state
    None: the optimizer is saved elsewhere, rl/sharded_checkpoint.py's shards)."""
    for name in TOKENIZER_FILES:
        source = Path(tokenizer_source) / name
        if source.is_file():
            shutil.copyfile(source, folder / name)
    if optimizer_state is not None:
        torch.save(optimizer_state, folder / OPTIMIZER_STATE)
    torch.save(rng, folder / RNG_STATE)
    record = {"format_version": FORMAT_VERSION, **meta}
    (folder / TRAINER_STATE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_checkpoint_state(folder: str | Path) -> CheckpointState:
    """The optimizer, RNG and trainer state of a checkpoint folder (weights load separately).
    A trainer group's folder gives optimizer None: its shards need the model's parameter
    names (rl/sharded_checkpoint.py's read_full_optimizer)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TrainerCheckpointError(f"checkpoint folder {folder} does not exist")
    for name in (TRAINER_STATE, RNG_STATE, "config.json"):
        if not (folder / name).is_file():
            raise TrainerCheckpointError(
                f"checkpoint folder {folder} has no {name} (not a trainer checkpoint?)"
            )
    sharded = (folder / SHARDED_STATE).is_dir()
    if not sharded and not (folder / OPTIMIZER_STATE).is_file():
        raise TrainerCheckpointError(
            f"checkpoint folder {folder} has neither {OPTIMIZER_STATE} nor {SHARDED_STATE}/"
        )
    try:
        meta = json.loads((folder / TRAINER_STATE).read_text())
        optimizer = (
            None
            if sharded
            else torch.load(folder / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
        )
        rng = torch.load(folder / RNG_STATE, map_location="cpu", weights_only=True)
    except (
        json.JSONDecodeError,
        pickle.UnpicklingError,
        RuntimeError,
        ValueError,
        OSError,
        EOFError,
    ) as err:
        raise TrainerCheckpointError(f"checkpoint folder {folder} is unreadable: {err}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise TrainerCheckpointError(
            f"checkpoint folder {folder} has format_version {meta.get('format_version')!r}; "
            f"this version reads {FORMAT_VERSION}"
        )
    return CheckpointState(meta, optimizer, rng)
