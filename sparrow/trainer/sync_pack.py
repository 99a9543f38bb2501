"""A sharded trainer's full weights packed on rank 0's device, in the engines' dtype, for the
weight sync of a trainer group (sparrow/runtime/rollout/weight_sync.py).

    packed = pack_full_weights(trainer, torch.bfloat16)            # a collective: every rank
    packed = pack_full_weights(trainer, torch.bfloat16, adapter)   # DistillSparse: merged
    # rank 0: engine/weight_share.py's SharedWeights on the trainer's device; other ranks: None

Tensors are gathered one at a time (DTensor.full_tensor: an all-gather over the FSDP ranks, on
their device) and cast straight into one flat buffer on rank 0, so nothing goes through host
memory and at most one full tensor is held beside the buffer. A tensor that is not merged is
cast before its gather (half the bytes in bf16; the cast is elementwise, so the result is the
same). Tied tensors (embeddings and lm_head: one parameter under two names) are gathered and
packed once, both names pointing at the same place; which names are tied is read from the
module tree, the same on every rank, so every rank runs the same gathers in the same order.
The buffer serves both routes to the engines: its CUDA IPC handle for an engine on rank 0's
GPU, and slices of it as the buckets of the broadcast to the others
(rl/weight_broadcast.py, SyncGroup.send_packed). With an adapter, an adapted weight is merged
in fp32 (W + alpha / rank x B A) before its cast, as rl/lora.py's merged_for_engine does; the
trainer's shards stay the plain policy.
Tests: tests/trainer/test_sync_pack.py (2 gloo ranks).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sparrow.engine.weight_share import SharedWeights


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def sync_layout(
    model: torch.nn.Module,
) -> tuple[dict[str, tuple[int, tuple[int, ...]]], dict[str, str], int]:
    """(name -> (element offset, full shape), name -> the first name of its tensor, total
    elements) over model.state_dict(keep_vars=True), tied tensors laid out once."""
    layout: dict[str, tuple[int, tuple[int, ...]]] = {}
    owner: dict[str, str] = {}
    first: dict[int, str] = {}
    total = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner[name] = first.setdefault(id(tensor), name)
        if owner[name] == name:
            shape = tuple(tensor.shape)  # a DTensor's shape is the full one
            layout[name] = (total, shape)
            total += _numel(shape)
        else:
            layout[name] = layout[owner[name]]
    return layout, owner, total


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def pack_full_weights(
    trainer: Any, dtype: torch.dtype, adapter: Any = None, group=None
) -> SharedWeights | None:
    """See the module doc. `trainer` is a ShardedPolicyTrainer (its .model and .device);
    `adapter` an rl/lora.py Adapter or None. A collective over `group` (default: the FSDP
    ranks' default group)."""
    layout, owner, total = sync_layout(trainer.model)
    rank = dist.get_rank(group)
    buffer = torch.empty(total if rank == 0 else 0, dtype=dtype, device=trainer.device)
    adapted = {f"{module}.weight" for module in adapter.modules} if adapter else set()
    for name, tensor in trainer.model.state_dict(keep_vars=True).items():
        if owner[name] != name:
            continue
        if name in adapted:
            full = _full(tensor.detach()).float()
            if rank == 0:
                full = full + adapter.delta(name[: -len(".weight")], full.device)
        else:
            full = _full(tensor.detach().to(dtype))
        if rank == 0:
            offset, shape = layout[name]
            buffer[offset : offset + full.numel()].view(shape).copy_(full)
        del full
    if rank != 0:
        return None
    if buffer.is_cuda:
        torch.cuda.synchronize(buffer.device)
    return SharedWeights(buffer, layout)
