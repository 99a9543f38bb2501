"""Fused SwiGLU gate: silu(gate) * up in one kernel (the decoder's MLP, between projections).

    h = silu_mul(gate, up)        # gate, up [T, I] -> [T, I]

Numerics are PyTorch's on the same dtype: silu in float32 rounded to the dtype, then the
product rounded. Off GPU, and whenever autograd needs the graph, the launcher runs
`silu_mul_reference`. Tests: `python -m pytest tests/kernels/test_fused_layers.py -q`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from sparrow.kernels.rms_norm import needs_autograd
from sparrow.kernels.runtime import check, check_last_dim_contiguous, jit, tl, use_kernel


@jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, s_g, s_u, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(g_ptr + row * s_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * s_u + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * s_o + cols, (silu * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def silu_mul(gate: torch.Tensor, up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """silu(gate) * up, same shape and dtype."""
    check(
        gate.shape == up.shape and gate.dtype == up.dtype,
        f"gate and up must share shape and dtype, got {tuple(gate.shape)} {gate.dtype} and "
        f"{tuple(up.shape)} {up.dtype}",
    )
    if not use_kernel(gate, up) or needs_autograd(gate, up):
        return silu_mul_reference(gate, up)
    n = gate.shape[-1]
    g, u = gate.reshape(-1, n), up.reshape(-1, n)
    check_last_dim_contiguous("gate", g)
    check_last_dim_contiguous("up", u)
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if g.shape[0] and n:
        _silu_mul_kernel[(g.shape[0], -(-n // block))](
            g, u, out, n, g.stride(0), u.stride(0), out.stride(0), BLOCK=block, num_warps=4
        )
    return out.view(gate.shape)
