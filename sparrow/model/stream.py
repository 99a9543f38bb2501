"""The residual stream between a decoder layer's sublayers, and the projections that read
and write it with the norm and the residual add folded into their kernels.

    x, normed = norm.open(stream)                 # x done; normed: a tensor or a Normed
    out = linear(normed, weight, bias)            # norm(x) @ weight^T, the norm in the kernel
    stream = add_linear(x, attended, o_proj)      # x + o_proj(attended), as the next stream

A decode batch of up to 16 rows in bf16/fp16 on GPU runs kernels/linear.py's skinny kernel,
which can apply an RMSNorm to x as it reads it (given the sums of squares of x's rows) and
add the residual as it writes its output (returning those sums for the next norm): the two
RMSNorm launches of a layer vanish. Elsewhere (CPU, autograd, wider batches, LoRA-wrapped
modules) the norm runs in its own kernel, which also does the pending residual add
(kernels/rms_norm.py), as everywhere with KernelOptions.fold_norms off (kernels/runtime.py,
set through EngineConfig.fold_norms). Both give the same values
to bf16 rounding, not bit for bit: the fused form rounds x times the norm's weight and scales
the sums by 1 / rms, where the norm kernel rounds the normalised x first.
Tests: `python -m pytest tests/model/test_residual_adds.py -q`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from sparrow.kernels.linear import RowNorm, serves, skinny_linear
from sparrow.kernels.rms_norm import rms_norm
from sparrow.kernels.runtime import current_options
from sparrow.kernels.silu_mul import silu_mul


@dataclass
class Stream:
    """x, the residual stream, and what the next norm has left to do: add `delta` (a
    sublayer's output, when no kernel added it) or nothing, with `sumsq` the sums of squares
    of x's rows in parts [blocks, rows] float32 when the skinny kernel wrote x."""

    x: Tensor
    delta: Tensor | None = None
    sumsq: Tensor | None = None


@dataclass
class Normed:
    """norm(x) not computed yet: the projection's kernel applies `norm` as it reads x."""

    x: Tensor
    norm: RowNorm

    def tensor(self) -> Tensor:
        return rms_norm(self.x, self.norm.weight, self.norm.eps)


def read(x: Tensor | Normed) -> Tensor:
    """The rows a projection reads, the norm applied when it was left to the kernel."""
    return x.tensor() if isinstance(x, Normed) else x


def open_stream(stream: Stream, weight: Tensor, eps: float) -> tuple[Tensor, Tensor | Normed]:
    """(x with any pending add done, norm(x) or a Normed for the next projection's kernel)."""
    if stream.sumsq is not None and stream.delta is None:
        return stream.x, Normed(stream.x, RowNorm(weight, eps, stream.sumsq))
    if stream.delta is None:
        return stream.x, rms_norm(stream.x, weight, eps)
    normed, x = rms_norm(stream.x, weight, eps, residual=stream.delta)
    return x, normed


def linear(x: Tensor | Normed, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (or norm(x)) @ weight^T + bias, the norm in the skinny kernel when it serves."""
    if isinstance(x, Normed) and serves(x.x, weight, norm=x.norm):
        return skinny_linear(x.x, weight, bias, norm=x.norm)
    return skinny_linear(read(x), weight, bias)


def add_linear(x: Tensor, a: Tensor, module: nn.Module, gated: bool = False) -> Stream:
    """The stream after x + module(a) (gated: a = [gate | up], module(silu(gate) * up)): the
    add and the sums of squares in the skinny kernel's epilogue when it serves, else the
    sum left to the next norm's kernel."""
    plain = type(module) is nn.Linear
    if plain and current_options().fold_norms and serves(a, module.weight, gated, residual=x):
        summed, sumsq = skinny_linear(a, module.weight, module.bias, gated=gated, residual=x)
        return Stream(summed, sumsq=sumsq)
    if plain:
        return Stream(x, delta=skinny_linear(a, module.weight, module.bias, gated=gated))
    if gated:  # the two halves as strided views: silu_mul takes any row stride
        a = silu_mul(*a.split(a.shape[-1] // 2, dim=-1))
    return Stream(x, delta=module(a))
