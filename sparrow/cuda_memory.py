"""This process's cached CUDA blocks back to the device (the engine's sleep, the flow's
hand-over to the rollout, a trainer rank after its update, the trainer's out-of-memory), and
allocations that come back at their addresses.

    return_cached_blocks()
    with frozen_heap():                    # a run's body: the collections above skip the imports
        ...
    freeze_actor_heap()                    # a Ray actor's start: the same for its whole life
    anchor = segment_anchor(device)        # held while the allocations below come and go
    with expandable_segments(device):      # the KV cache: same addresses at every wake
        k = torch.zeros(shape, device=device)
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def return_cached_blocks() -> None:
    """Give the caching allocator's unused blocks back to the device, so another process on
    the same GPU (an engine, a trainer rank, NCCL) can have them; each process must do this
    itself. Cyclic garbage may hold CUDA tensors, so it is collected first."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside, the objects alive at entry (a process's imports: torch, transformers, Ray,
    Prefect, MLflow, about 600K objects) are out of the collector's sight, so the full
    collection of return_cached_blocks and Python's own oldest-generation passes look only
    at what was made since (0.27 s per full collection on a 2-core CPU with them in sight, ~0
    without). Garbage made inside is collected as before; a cycle among the objects frozen at
    entry waits until exit. Enter before the run builds any trainer or engine, so none of
    their CUDA tensors can be among the frozen. A heap someone froze already (a library, the
    caller, an outer frozen_heap: even a few hundred objects) is frozen further, to all that
    is alive at entry, and left frozen at exit: the thaw is theirs."""
    thaw = gc.get_freeze_count() == 0
    gc.collect()  # what is already garbage goes now, not frozen
    gc.freeze()
    try:
        yield
    finally:
        if thaw:
            gc.unfreeze()


def freeze_actor_heap() -> bool:
    """In a Ray actor's process (which lives for the actor and holds only it), freeze its
    heap as it stands, as frozen_heap does for a run; elsewhere (an actor's class run
    in-process, the driver) nothing. True when it froze."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    gc.collect()
    gc.freeze()
    return True


def _process_expandable() -> bool:
    """Whether the process started with torch's expandable segments (its allocator setting)."""
    conf = (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        + ","
        + os.environ.get("PYTORCH_ALLOC_CONF", "")
    )
    return "expandable_segments:true" in conf.replace(" ", "").lower()


@contextmanager
def expandable_segments(device: torch.device | str) -> Iterator[None]:
    """CUDA allocations made inside land in torch's expandable segments, whatever the process's
    allocator setting. Such a segment keeps its virtual address range when empty_cache gives
    the memory back, and the next allocations of the same sizes in the same order are mapped
    at the same addresses again; with the default allocator, a freed range goes back to the
    driver, whose next cudaMalloc may return any address. A no-op off CUDA, or where the
    process already runs on expandable segments."""
    if torch.device(device).type != "cuda" or _process_expandable():
        yield
        return
    _set_allocator("expandable_segments:True")
    try:
        yield
    finally:
        _set_allocator("expandable_segments:False")


def _set_allocator(settings: str) -> None:
    # torch 2.11 moved the setter to the accelerator API and deprecated the CUDA one
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    (setter or torch.cuda.memory._set_allocator_settings)(settings)


@contextmanager
def own_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Allocations made inside come from `stream`'s blocks (and, in expandable segments, its
    own segment, which nothing of another stream shares); the current stream then waits for
    the work queued there (the zero fill). A no-op for None (off CUDA)."""
    if stream is None:
        yield
        return
    current = torch.cuda.current_stream(stream.device)
    with torch.cuda.stream(stream):
        yield
    current.wait_stream(stream)


def segment_anchor(device: torch.device | str) -> torch.Tensor | None:
    """A small allocation (one 2 MiB page) in the expandable segment that the KV cache uses,
    held for the life of an engine: a segment left with nothing in it is released with its
    address range at empty_cache, and the next cache would lie elsewhere; the anchor keeps the
    range, so the cache comes back at its addresses at every wake. None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    with expandable_segments(device):
        return torch.empty(2 * 2**20, dtype=torch.uint8, device=device)
