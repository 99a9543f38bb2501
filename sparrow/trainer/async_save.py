"""Trainer checkpoints written in the background from a host snapshot.

    saver = BackgroundSaver()
    future = saver.save(folder, model, optimizer, tokenizer_source, meta)   # returns at once
    future.result()                     # the folder exists, complete, renamed into place

At Qwen3-1.7B a trainer checkpoint is about 20 GB (fp32 weights and AdamW moments), which
takes the disk 15-25 s: longer than the update itself. The snapshot copies every tensor into
pinned host buffers (kept and reused between saves: allocating 20 GB of pinned memory each
time costs seconds), a device-to-host copy of a second or two; a worker thread then writes
the same layout as save_checkpoint (rl/checkpoint.py) into a scratch folder and renames it,
while the GPU goes on with the next rollout. One save is in flight at a time: a new one
waits for the last. Tied tensors (embeddings and lm_head) are written once, as
save_pretrained does.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from sparrow.errors import disk_full_error, is_disk_full
from sparrow.scratch import scratch_dir
from sparrow.trainer.checkpoint import (
    TrainerCheckpointError,
    rng_state,
    tensor_bytes,
    write_trainer_files,
)


class BackgroundSaver:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer-save")
        self._buffers: dict[str, torch.Tensor] = {}
        self._pending: Future | None = None

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; re-raises its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def save(
        self,
        folder: str | Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        tokenizer_source: str | Path,
        meta: dict[str, Any],
    ) -> Future:
        self.wait()  # the buffers are reused: the last write must be done with them
        out = Path(folder)
        if out.exists():
            raise TrainerCheckpointError(f"checkpoint folder {out} already exists")
        weights = self._snapshot_weights(model)
        optimizer_state = self._snapshot_optimizer(optimizer)
        rng = rng_state()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        config = model.config.to_json_string()
        generation = getattr(model, "generation_config", None)
        generation = generation.to_json_string() if generation is not None else None
        self._pending = self._pool.submit(
            _write,
            out,
            weights,
            optimizer_state,
            rng,
            config,
            generation,
            Path(tokenizer_source),
            meta,
        )
        return self._pending

    def _host(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda
            )
            self._buffers[key] = buffer
        return buffer.copy_(tensor.detach(), non_blocking=True)

    def _snapshot_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        seen: set[int] = set()
        weights = {}
        for name, tensor in model.state_dict().items():
            if tensor.data_ptr() in seen:
                continue  # tied to a tensor already taken (lm_head to the embeddings)
            seen.add(tensor.data_ptr())
            weights[name] = self._host(f"w:{name}", tensor)
        return weights

    def _snapshot_optimizer(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = optimizer.state_dict()
        copied = {}
        for index, values in state["state"].items():
            copied[index] = {
                key: self._host(f"o:{index}:{key}", value)
                if torch.is_tensor(value) and value.dim() > 0
                else (value.clone() if torch.is_tensor(value) else value)
                for key, value in values.items()
            }
        return {"state": copied, "param_groups": state["param_groups"]}


def _write(
    out: Path,
    weights,
    optimizer_state,
    rng,
    config,
    generation,
    tokenizer_source: Path,
    meta: dict[str, Any],
) -> Path:
    from safetensors.torch import save_file

    scratch = scratch_dir(out)  # makes out's parent too
    try:
        save_file(weights, str(scratch / "model.safetensors"), metadata={"format": "pt"})
        (scratch / "config.json").write_text(config)
        if generation is not None:
            (scratch / "generation_config.json").write_text(generation)
        write_trainer_files(scratch, optimizer_state, rng, tokenizer_source, meta)
        os.replace(scratch, out)
    except Exception as err:
        if is_disk_full(err, out.parent):
            raise disk_full_error(out, tensor_bytes([weights, optimizer_state])) from None
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
