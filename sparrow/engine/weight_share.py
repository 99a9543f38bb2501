"""Weight sync between processes on one GPU through CUDA IPC: no disk, no host copy.

    shared = SharedWeights.pack(trainer.state_dict_for_sync(), torch.bfloat16)   # trainer side
    message = shared.message()            # plain, picklable: travels to the rollout actor
    tensors = open_message(message)       # actor side: name -> view of the trainer's buffer
    engine.update_weights(tensors); del tensors; release_opened()
    shared.close()                        # trainer side, once every actor has copied

The trainer casts its (fp32) weights once into one flat buffer in the engine's dtype; the
buffer's CUDA IPC handle (torch.multiprocessing's tensor reduction) goes to each colocated
rollout actor, which maps it and copies by name into its own weights in place. A GPU-to-GPU
copy of the whole model (3.4 GB at Qwen3-1.7B in bf16) instead of a safetensors round trip.
An actor on another GPU (device uuids differ) cannot map the buffer: `same_device` says so and
the caller falls back to loading the policy folder. Tied tensors (embeddings and lm_head) are
packed once. A trainer group's rank 0 fills the same structure from its FSDP shards
(rl/sync_pack.py; on CPU ranks the buffer stays in host memory and is only broadcast).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


def device_uuid(index: int | None = None) -> str:
    """The CUDA device's uuid ("" without CUDA): the same physical GPU in any process."""
    if not torch.cuda.is_available():
        return ""
    if index is None:
        index = torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


@dataclass
class SharedWeights:
    buffer: torch.Tensor
    # name -> (element offset, shape)
    layout: dict[str, tuple[int, tuple[int, ...]]]

    @classmethod
    @torch.no_grad()
    def pack(
        cls,
        state: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> SharedWeights:
        """One buffer on `device` (default: the tensors' own, which must be CUDA); host
        tensors (a sharded trainer's gathered state) are copied in directly."""
        first = next(iter(state.values()))
        device = torch.device(device) if device is not None else first.device
        if device.type != "cuda":
            raise ValueError("SharedWeights packs into CUDA memory only")
        layout: dict[str, tuple[int, tuple[int, ...]]] = {}
        seen: dict[tuple[int, tuple[int, ...]], int] = {}
        total = 0
        for name, tensor in state.items():
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key not in seen:
                seen[key] = total
                total += tensor.numel()
            layout[name] = (seen[key], tuple(tensor.shape))
        buffer = torch.empty(total, dtype=dtype, device=device)
        done: set[int] = set()
        for name, tensor in state.items():
            offset, shape = layout[name]
            if offset not in done:
                buffer[offset : offset + tensor.numel()].view(shape).copy_(tensor)
                done.add(offset)
        torch.cuda.synchronize(device)
        return cls(buffer, layout)

    def message(self) -> dict[str, Any]:
        """What a colocated process needs to map the buffer (picklable)."""
        from torch.multiprocessing.reductions import reduce_tensor

        if not self.buffer.is_cuda:
            raise ValueError("only a CUDA buffer can be shared through CUDA IPC")

        rebuild, args = reduce_tensor(self.buffer)
        return {
            "rebuild": rebuild,
            "args": args,
            "layout": self.layout,
            "uuid": device_uuid(self.buffer.device.index),
        }

    def close(self) -> None:
        on_cuda = self.buffer.is_cuda
        self.buffer = torch.empty(0)
        if on_cuda:
            torch.cuda.empty_cache()


def same_device(message: Mapping[str, Any]) -> bool:
    """Whether this process's current CUDA device is the one the buffer lives on."""
    return bool(message.get("uuid")) and message["uuid"] == device_uuid()


def open_message(message: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Name -> tensor views of the sender's buffer (read them, then drop them)."""
    if not same_device(message):
        raise ValueError("the shared weights live on another GPU than this process's")
    args = list(message["args"])
    # the sender's device index is its own numbering; map it to ours (same uuid, checked)
    args[6] = torch.cuda.current_device()
    buffer = message["rebuild"](*args)
    return {
        name: buffer[offset : offset + _numel(shape)].view(shape)
        for name, (offset, shape) in message["layout"].items()
    }


def release_opened() -> None:
    """Let the driver free IPC memory this process mapped (after the views are dropped)."""
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
