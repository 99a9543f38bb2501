"""Split-K combine: merge partial softmax-attention results of one query head into one output.

    out = combine_splits(partial_out, partial_lse, out_dtype)   # [B, H, S, D], [B, H, S] -> [B, H, D]

A split-K decode kernel cuts a sequence's keys into S splits; split s returns its normalised
output o_s and its log-sum-exp (base 2) lse_s over its keys, or lse_s = -inf when it read no
key. The exact result is sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse). A row
whose splits are all empty (a padded batch row with no tokens) is zero.

The merge is its own kernel, one program per row, launched after the split kernel
(paged_decode.py).
Tests: `python -m pytest tests/kernels -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.runtime import (
    check,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)


@jit
def merge_row(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    row,
    splits,
    dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[row] = the weighted merge of partial rows row * splits .. + splits - 1."""
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(part_lse_ptr + row * splits + s, mask=s < splits, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp2(lse - top)
    part = tl.load(
        part_o_ptr + (row * splits + s)[:, None] * dim + d[None, :],
        mask=(s < splits)[:, None] & (d < dim)[None, :],
        other=0.0,
    )
    total = tl.sum(weight, axis=0)
    out = tl.sum(part * weight[:, None], axis=0) / tl.maximum(total, 1e-30)
    tl.store(out_ptr + row * dim + d, out.to(out_ptr.dtype.element_ty), mask=d < dim)


@jit
def _combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    splits,
    dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # see runtime.py: wait for the kernel before
        gdc_wait()
    merge_row(part_o_ptr, part_lse_ptr, out_ptr, tl.program_id(0), splits, dim, BLOCK_S, BLOCK_D)
    if PDL:  # let the next kernel launch (its programs place as these leave)
        gdc_launch_dependents()


def combine_reference(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """PyTorch form of the combine (float32), same semantics as the kernel."""
    top = partial_lse.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weight = torch.exp2(partial_lse - top)  # empty splits: 2^-inf = 0
    total = weight.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    out = (partial_out * weight.unsqueeze(-1)).sum(dim=-2) / total
    return out.to(out_dtype)


def combine_splits(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """[B, H, S, D] float32 outputs and [B, H, S] base-2 lse -> [B, H, D] in out_dtype."""
    check(
        partial_out.dim() == 4 and partial_lse.shape == partial_out.shape[:3],
        f"partial_out [B, H, S, D] and partial_lse [B, H, S] disagree: "
        f"{tuple(partial_out.shape)} vs {tuple(partial_lse.shape)}",
    )
    check(
        partial_out.dtype == torch.float32 and partial_lse.dtype == torch.float32,
        "partial_out and partial_lse must be float32",
    )
    if not use_kernel(partial_out, partial_lse):
        return combine_reference(partial_out, partial_lse, out_dtype)
    partial_out, partial_lse = partial_out.contiguous(), partial_lse.contiguous()
    batch, heads, splits, dim = partial_out.shape
    out = torch.empty(batch, heads, dim, dtype=out_dtype, device=partial_out.device)
    if batch * heads:
        pdl = pdl_launch(partial_out.device)
        _combine_kernel[(batch * heads,)](
            partial_out,
            partial_lse,
            out,
            splits,
            dim,
            BLOCK_S=next_power_of_2(splits),
            BLOCK_D=next_power_of_2(dim),
            PDL=pdl,
            launch_pdl=pdl,
        )
    return out
