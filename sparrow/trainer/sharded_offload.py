"""Moving an FSDP2 rank's shards (weights, AdamW moments) off its GPU and back.

    move_shards(trainer.root, trainer.optimizer, torch.device("cpu"))    # offload
    move_shards(trainer.root, trainer.optimizer, trainer.device)         # onload

ShardedPolicyTrainer.offload / onload (algo.offload_during_rollout with a trainer group) call
this. The module's own `_apply`, which FSDP2 overrides for exactly this (`FSDPModule._apply`
reshards first and re-registers every sharded parameter after the move, padding included),
moves the parameters and buffers; the parameter objects stay the same, so the optimizer keeps
them, and its moments (DTensors) follow them. Every tensor is copied (`copy=True`), also from
host to host, so a CPU rank's round trip goes through fresh memory as a GPU rank's does; that
is what the CPU tests hold. Gradients must be freed first.
Tests: tests/trainer/test_sharded_offload.py (gloo), test_multigpu.py (NCCL).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def move_shards(
    root: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    """The FSDP root's parameters and buffers, and the optimizer's moments, to `device`."""
    if any(p.grad is not None for p in root.parameters()):
        raise RuntimeError("free the gradients before moving the shards")
    root._apply(lambda t: t.to(device, copy=True))
    for state in optimizer.state.values():
        for key, value in state.items():
            # "step" is a host scalar AdamW keeps on the CPU; it stays where it is
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = value.to(device, copy=True)
    if device.type == "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()
