"""One pinned host buffer for a trainer's tensors while the rollout engines hold the GPU,
allocated once and reused at every offload.

    stash = HostStash(pin=True)                 # one per trainer (per rank in a group)
    stash.reserve(HostStash.bytes_for(tensors)) # optional: pin ahead of the first offload
    hosts = stash.to_host(tensors)              # copies in the buffer, done when it returns
    param.data = hosts[0]                       # ... the caller points its tensors at them
    param.data = param.data.to(device, non_blocking=True)   # onload: async from pinned memory

Why: the offload before a rollout moved ~24 GB at Qwen3-1.7B shape (bf16 weights, fp32
masters, AdamW moments) into pinned memory allocated afresh at every offload, through torch's
pinned allocator (sizes rounded up to powers of two, each block page-locked by the driver):
28-34 s of `time/rollout_release_s` at 32K (issue 38). Here every tensor has a slot (aligned
to 512 bytes) in one buffer of exact size, page-locked once with cudaHostRegister, as torch's
distributed checkpoint stager does; later offloads copy into the same slots (the layout is
worked out again each time, so a resumed optimizer's new moments still fit without a new
buffer when their bytes do). `allocations` counts the buffers made (tests hold it at 1).
The device-to-host copies are waited for before `to_host` returns: the caller frees the
device memory next, and the engines allocate it at their wake. No side stream: nothing else
is queued to overlap them with. The way back is the caller's `.to(device, non_blocking=True)`,
which from page-locked memory returns at once, the first forward queued behind the copies.
Used by PolicyTrainer.offload and sparrow/trainer/sharded_offload.py.
Tests: tests/trainer/test_host_stash.py (CPU), tests/trainer/test_policy_trainer_gpu.py (gpu).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

import torch

ALIGN = 512  # bytes; every slot starts at a multiple (DMA-friendly, any dtype's view)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank, else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class HostStash:
    """Host copies of device tensors in one reused buffer (see the module doc)."""

    def __init__(self, pin: bool):
        self.pin = pin
        self.buffer: torch.Tensor | None = None  # uint8
        self.allocations = 0  # buffers made so far
        self.pin_seconds = 0.0  # time spent allocating and page-locking them
        self._unpin: weakref.finalize | None = None

    @staticmethod
    def bytes_for(tensors: Sequence[torch.Tensor]) -> int:
        """Bytes of the buffer that holds these tensors (DTensors: their shards; each slot
        aligned)."""
        return sum(_aligned(_local(t).numel() * t.element_size()) for t in tensors)

    def reserve(self, nbytes: int) -> None:
        """A buffer of at least nbytes; a smaller one is given back and replaced."""
        if self.buffer is not None and self.buffer.numel() >= nbytes:
            return
        self.release()
        clock = time.perf_counter()
        self.buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        if self.pin:
            self._unpin = _page_lock(self.buffer)
        self.allocations += 1
        self.pin_seconds += time.perf_counter() - clock

    def release(self) -> None:
        """Unlock and drop the buffer (the trainer no longer offloads)."""
        if self._unpin is not None:
            self._unpin()
            self._unpin = None
        self.buffer = None

    def to_host(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Host copies of `tensors` (DTensors: their local shards), views into the buffer with
        each tensor's dtype and shape, complete when this returns. Holds the buffer's slots
        until the next call: the caller must be done with the last call's views."""
        tensors = [_local(t) for t in tensors]
        self.reserve(self.bytes_for(tensors))
        views, offset, device_sync = [], 0, False
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            view = self.buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor, non_blocking=True)
            device_sync = device_sync or tensor.is_cuda
            views.append(view)
            offset += _aligned(nbytes)
        if device_sync:
            torch.cuda.synchronize()
        return views

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` (or its shard) lies in this stash's buffer."""
        if self.buffer is None:
            return False
        start = self.buffer.data_ptr()
        pointer = _local(tensor).data_ptr()
        return start <= pointer < start + self.buffer.numel()


def _page_lock(buffer: torch.Tensor) -> weakref.finalize:
    """cudaHostRegister over the buffer's exact bytes; the returned finalizer unregisters it
    (called by release(), or when the buffer is collected)."""
    pointer, nbytes = buffer.data_ptr(), buffer.numel()
    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(pointer, nbytes, 0))
    if error != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with CUDA error {error}")
    return weakref.finalize(buffer, _unregister, pointer)


def _unregister(pointer: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(pointer)
