"""Load a Decoder from a local Hugging Face directory (config.json + safetensors), no network.

    model = load_model("/models/Qwen3-1.7B", dtype=torch.bfloat16, device="cuda")

Weights come from model.safetensors, or from the shards listed in
model.safetensors.index.json. The decoder is built on the meta device (no memory, no random
init), given empty storage of the requested dtype on the requested device, then every tensor
is copied in by name, one tensor at a time (safetensors reads lazily), through
Decoder.load_hf_state_dict(strict=True): a missing or misshapen tensor is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from sparrow.errors import SparrowError
from sparrow.model.config import ModelArch
from sparrow.model.decoder import Decoder, WeightLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(SparrowError, FileNotFoundError):
    """A checkpoint directory that lacks a file, or whose files disagree."""


def read_arch(path: str | Path) -> ModelArch:
    """The ModelArch of a checkpoint directory (its config.json)."""
    folder = _folder(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"no config.json in model directory {folder}")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_file} is not valid JSON: {err}") from None
    return ModelArch.from_hf_config(config)


class SafetensorsCheckpoint(Mapping[str, Tensor]):
    """The tensors of a (possibly sharded) safetensors checkpoint, read on access."""

    def __init__(self, path: str | Path):
        folder = _folder(path)
        self._location = _tensor_files(folder)
        self._handles: dict[Path, object] = {}

    def _handle(self, file: Path):
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), framework="pt", device="cpu")
        return self._handles[file]

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._location:
            raise KeyError(name)
        return self._handle(self._location[name]).get_tensor(name)

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self._location[name]).get_slice(name).get_shape())

    def __iter__(self) -> Iterator[str]:
        return iter(self._location)

    def __len__(self) -> int:
        return len(self._location)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Decoder:
    """A Decoder holding the checkpoint's weights, in eval mode, on `device` in `dtype`."""
    arch = read_arch(path)
    checkpoint = SafetensorsCheckpoint(path)
    with torch.device("meta"):
        model = Decoder(arch)
    model = model.to(dtype=dtype).to_empty(device=device)
    try:
        model.load_hf_state_dict(checkpoint, strict=True)
    except WeightLoadError as err:
        raise WeightLoadError(f"checkpoint {Path(path)}: {err}") from None
    return model.eval()


def _folder(path: str | Path) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CheckpointError(f"model directory {folder} does not exist")
    return folder


def _tensor_files(folder: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it."""
    single, index = folder / SINGLE_FILE, folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{index} is not a safetensors index (no weight_map)") from None
        files = {name: folder / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointError(f"shard {file} listed in {index} does not exist")
        return files
    if single.is_file():
        with safe_open(str(single), framework="pt", device="cpu") as handle:
            return {name: single for name in handle.keys()}
    others = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (found {', '.join(others)}: only safetensors is read)" if others else ""
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in model directory {folder}{hint}")
