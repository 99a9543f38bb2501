"""Moving an FSDP2 rank's shards (weights, AdamW moments) off its GPU and back, through the
rank's page-locked host buffer (rl/host_stash.py: allocated once, reused at every offload).

    offload_shards(trainer.root, trainer.optimizer, stash)       # into the stash
    onload_shards(trainer.root, trainer.optimizer, trainer.device)

ShardedPolicyTrainer.offload / onload (trainer.offload_during_rollout with a trainer group) call
these through rl/offload.py. The module's own `_apply`, which FSDP2 overrides for exactly this
(`FSDPModule._apply` reshards first and re-registers every sharded parameter after the move,
padding included), points the parameters and buffers at their new tensors; the parameter
objects stay the same, so the optimizer keeps them, and its moments (DTensors) follow them.
Offload: every shard and moment is copied into the stash first (one synchronize), and each
DTensor is rebuilt around its host view with its own spec (no copy: DTensor.from_local would
move the view back to the mesh's device); a shard FSDP pads (a first dimension the ranks do
not divide) is padded again in fresh host memory by FSDP, which the real shapes at 2, 4 and
8 ranks never need. Onload: copies queued on the current
stream from the page-locked views (FSDP pads a padded shard again on the device).
Every tensor is copied, also from host to host, so a CPU rank's round trip goes through fresh
memory as a GPU rank's does; that is what the CPU tests hold. Gradients must be freed first.
Tests: tests/trainer/test_sharded_offload.py (gloo), test_multigpu.py (NCCL).
"""

from __future__ import annotations

import torch

from sparrow.trainer.host_stash import HostStash


def _reshard(root: torch.nn.Module) -> None:
    """Every FSDP unit's sharded parameters registered (none left gathered)."""
    for module in root.modules():
        if hasattr(module, "reshard"):
            module.reshard()


def shard_tensors(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list:
    """What an offload moves: the root's parameters (DTensors) and buffers, then the moments."""
    _reshard(root)
    moments = [
        value
        for state in optimizer.state.values()
        for value in state.values()
        # "step" is a host scalar AdamW keeps on the CPU; it stays where it is
        if torch.is_tensor(value) and value.dim() > 0
    ]
    return list(root.parameters()) + list(root.buffers()) + moments


def _around(tensor: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` in `tensor`'s place: a DTensor with the same spec (mesh, placements, shape),
    wrapped where it lies. DTensor.from_local would copy a host `local` back onto a GPU mesh's
    device (it moves a local tensor to the mesh's device type), keeping the shards on the GPU."""
    if not hasattr(tensor, "to_local"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor(local, tensor._spec, requires_grad=False)


def _check_no_gradients(root: torch.nn.Module) -> None:
    if any(p.grad is not None for p in root.parameters()):
        raise RuntimeError("free the gradients before moving the shards")


@torch.no_grad()
def offload_shards(
    root: torch.nn.Module, optimizer: torch.optim.Optimizer, stash: HostStash
) -> None:
    """The rank's shards, buffers and moments into `stash`, the owners pointed at the views."""
    _check_no_gradients(root)
    tensors = shard_tensors(root, optimizer)
    hosts = {id(t): _around(t, h) for t, h in zip(tensors, stash.to_host(tensors))}
    root._apply(lambda t: hosts[id(t)] if id(t) in hosts else t.to("cpu", copy=True))
    _replace_moments(optimizer, lambda value: hosts[id(value)])
    # the caller returns the freed device blocks once this frame (which still holds the
    # replaced device tensors, swapped into `hosts` by _apply) is gone


@torch.no_grad()
def onload_shards(
    root: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    """Everything offload_shards moved, on `device` again (copies queued, not waited for)."""
    _check_no_gradients(root)

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device, non_blocking=True, copy=True)

    root._apply(move)
    _replace_moments(optimizer, move)


def _replace_moments(optimizer: torch.optim.Optimizer, new) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = new(value)
