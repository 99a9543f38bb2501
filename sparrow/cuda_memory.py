"""This process's cached CUDA blocks back to the device (the engine's sleep, the flow's
hand-over to the rollout, a trainer rank after its update, the trainer's out-of-memory)."""

from __future__ import annotations

import gc

import torch


def return_cached_blocks() -> None:
    """Give the caching allocator's unused blocks back to the device, so another process on
    the same GPU (an engine, a trainer rank, NCCL) can have them; each process must do this
    itself. Cyclic garbage may hold CUDA tensors, so it is collected first."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
