"""The skinny linear layer's semantics in PyTorch (what sparrow/kernels/linear.py's kernel
computes, and runs in its place off the GPU), and RowNorm, the RMSNorm it can fold in.

    y = skinny_linear_reference(x, weight, bias)                     # F.linear
    s, sumsq = skinny_linear_reference(a, w_o, residual=x, block_n=64)
    y = skinny_linear_reference(s, w_qkv, norm=RowNorm(norm_weight, eps, sumsq))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from sparrow.kernels.rms_norm import rms_norm_reference
from sparrow.kernels.silu_mul import silu_mul


@dataclass(frozen=True)
class RowNorm:
    """RMSNorm for the kernel to apply to x's rows: the norm's weight [K] (x times it is
    rounded as x is read) and eps, and sumsq [blocks, M] float32, the sums of squares of x's
    rows in parts (what a `residual=` call returns beside x); each row's 1 / rms then scales
    its sums, so no program waits on a whole row before streaming W. Equal to the norm
    kernel then the product to bf16 rounding, not bit for bit (the norm kernel rounds the
    normalised x before the weight)."""

    weight: torch.Tensor
    eps: float
    sumsq: torch.Tensor


def skinny_linear_reference(
    x,
    weight,
    bias=None,
    gated: bool = False,
    norm: RowNorm | None = None,
    residual: torch.Tensor | None = None,
    block_n: int | None = None,
):
    """The same semantics in PyTorch: silu_mul or the RMSNorm (from x itself, not
    norm.sumsq) before F.linear; with residual, (residual + y, its rows' sums of squares
    float32 in parts: [blocks, M] over column blocks of block_n, as the kernel cuts them,
    or [1, M] without block_n)."""
    if gated:
        gate, up = x.split(weight.shape[1], dim=-1)
        x = silu_mul(gate, up)
    if norm is not None:
        x = rms_norm_reference(x, norm.weight, norm.eps)
    y = F.linear(x, weight, bias)
    if residual is None:
        return y
    summed = residual + y
    squares = summed.float().pow(2)
    if block_n is None:
        return summed, squares.sum(-1)[None]
    blocks = -(-squares.shape[-1] // block_n)
    padded = F.pad(squares, (0, blocks * block_n - squares.shape[-1]))
    return summed, padded.view(-1, blocks, block_n).sum(-1).T.contiguous()
