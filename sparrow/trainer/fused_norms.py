"""One fused kernel per RMSNorm in the trainer's transformers model.

    count = fuse_rms_norms(model)       # every *RMSNorm module now calls torch.rms_norm

transformers' Qwen3 / Qwen2 / Llama RMSNorm upcasts to fp32 and runs about seven elementwise
kernels (copy, pow, mean, add, rsqrt, mul, copy back, mul by the weight); a Qwen3 layer has
four norms (two around attention and the MLP, and the per-head q and k norms), and on the H100
at Qwen3-1.7B shape these kernels were most of the non-matmul GPU time of dense scoring.
torch.rms_norm computes the same function (mean of squares in fp32, then the weight) in one
kernel forward and one backward on CUDA. The result differs from transformers' only in
rounding: transformers rounds the normalized input to the compute dtype before the weight,
the fused kernel rounds once at the end.
Tests: `python -m pytest tests/trainer/test_fused_norms.py -q`.
"""

from __future__ import annotations

import types

import torch


def _fused_forward(self, hidden: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(
        hidden, (hidden.shape[-1],), self.weight, self.variance_epsilon
    )


def is_rms_norm(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and hasattr(module, "variance_epsilon")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
    )


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Point every transformers RMSNorm of `model` at torch.rms_norm; returns how many."""
    count = 0
    for module in model.modules():
        if is_rms_norm(module):
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count
