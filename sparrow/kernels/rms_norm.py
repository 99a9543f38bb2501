"""Fused RMSNorm, optionally with the residual add before it: one kernel per call.

    y = rms_norm(x, weight, eps)                         # the decoder's RMSNorm
    y, summed = rms_norm(x, weight, eps, residual=delta) # summed = x + delta, y = norm(summed)

x, delta [T, N]; weight [N]. Numerics are the decoder's (model/layers.py, transformers'
Qwen3): the sum rounded to x's dtype, the norm in float32, cast to x's dtype, then times the
weight in the promoted dtype. One program per row. Off GPU, and whenever autograd needs the
graph, the launcher runs `rms_norm_reference` (plain PyTorch). Tests:
`python -m pytest tests/kernels/test_fused_layers.py -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.runtime import (
    check,
    check_last_dim_contiguous,
    jit,
    next_power_of_2,
    tl,
    use_kernel,
)


@jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    sum_ptr,
    n,
    eps,
    s_x,
    s_r,
    s_y,
    s_s,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        x = (
            x.to(tl.float32)
            + tl.load(res_ptr + row * s_r + cols, mask=mask, other=0.0).to(tl.float32)
        ).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * s_s + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x32 * x32, axis=0) / n + eps)
    normed = (x32 * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * s_y + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """The decoder's RMSNorm (float32 norm, cast back, times the weight), after x + residual."""
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * x32.to(x.dtype)
    return y if residual is None else (y, x)


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """Whether autograd records these tensors (the kernels have no backward)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """norm(x) [T, N]; with residual, (norm(x + residual), x + residual)."""
    check(
        x.dim() >= 1 and weight.shape == x.shape[-1:],
        f"weight must be [{x.shape[-1] if x.dim() else '?'}], got {tuple(weight.shape)}",
    )
    check(
        residual is None or residual.shape == x.shape,
        f"residual must have x's shape {tuple(x.shape)}, got "
        f"{None if residual is None else tuple(residual.shape)}",
    )
    extra = () if residual is None else (residual,)
    if not use_kernel(x, weight, *extra) or needs_autograd(x, weight, *extra):
        return rms_norm_reference(x, weight, eps, residual)
    shape, n = x.shape, x.shape[-1]
    rows = x.reshape(-1, n)
    res = rows if residual is None else residual.reshape(-1, n)
    for name, t in (("x", rows), ("residual", res), ("weight", weight)):
        check_last_dim_contiguous(name, t)
    y = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    summed = torch.empty_like(rows) if residual is not None else y
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            res,
            weight,
            y,
            summed,
            n,
            eps,
            rows.stride(0),
            res.stride(0),
            y.stride(0),
            summed.stride(0),
            HAS_RES=residual is not None,
            BLOCK=next_power_of_2(n),
            num_warps=4 if n >= 1024 else 1,
        )
    if residual is None:
        return y.view(shape)
    return y.view(shape), summed.view(shape)
