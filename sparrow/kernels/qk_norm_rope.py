"""Fused per-head q/k RMSNorm and rotary embedding: one kernel for both q and k of a layer,
which can also store the rotated k and v in the paged KV cache (decode).

    q, k = qk_norm_rope(q, k, cos, sin, q_weight, k_weight, eps)   # weights None: RoPE only
    q, k = qk_norm_rope(q, k, cos, sin, q_weight, k_weight, eps, v=v, store=store)  # + KV write

q [T, Hq, D], k [T, Hkv, D] (the projections' outputs); cos, sin [T, 1, D] in q's dtype
(model/layers.py's Rotary.cos_sin, rotate-half layout); q_weight, k_weight [D]. Numerics are
the decoder's: the norm in float32, cast, times the weight; then x * cos + rotate_half(x) * sin
with each product and the sum rounded to the dtype, as PyTorch computes them. One program
per (token, head) over the Hq + Hkv heads; the rotated half is a second load of the same
row at the partner index. Off GPU, and whenever autograd needs the graph, the launcher runs
`qk_norm_rope_reference`.

With a store (kv_write.KVStore: one layer's caches, centroids and the tokens' slots) and v
[T, Hkv, D], each k-head program also stores its rotated k row (as returned, then rounded to
the cache dtype) and the token's v row at the token's slot, and sets the page's centroid when
the token fills it, through kv_write's own `store_kv_row` (float8 centroids included, rounded
as kv_write rounds them): the results equal qk_norm_rope then write_kv bit for bit, with one
launch instead of two. The fallback runs the
reference, then write_kv. Tests: `python -m pytest tests/kernels/test_fused_layers.py
tests/kernels/test_qk_norm_rope_store.py -q`.
"""

from __future__ import annotations

import torch

from sparrow.kernels.kv_write import KVStore, store_kv_row, write_kv
from sparrow.kernels.rms_norm import needs_autograd, rms_norm_reference
from sparrow.kernels.runtime import (
    check,
    check_last_dim_contiguous,
    gdc_launch_dependents,
    gdc_wait,
    jit,
    next_power_of_2,
    pdl_launch,
    tl,
    use_kernel,
)


@jit
def _normed(ptr, w_ptr, cols, mask, inv, NORM: tl.constexpr):
    """One head's row at cols, normalised and weighted as the decoder does (float32 out)."""
    x = tl.load(ptr + cols, mask=mask, other=0.0)
    if NORM:
        x = (x.to(tl.float32) * inv).to(ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x * w).to(ptr.dtype.element_ty)
    return x.to(tl.float32)


@jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    qo_ptr,
    ko_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    cent_ptr,
    slot_ptr,
    q_heads,
    dim,
    eps,
    s_qt,
    s_qh,
    s_kt,
    s_kh,
    s_ct,
    s_st,
    s_qot,
    s_qoh,
    s_kot,
    s_koh,
    s_vt,
    s_vh,
    s_page,
    s_offset,
    s_head,
    s_cent_page,
    s_cent_head,
    NORM: tl.constexpr,
    STORE: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # see runtime.py: wait for the kernel before (the projection writing q, k, v)
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < q_heads:
        src = q_ptr + t * s_qt + head * s_qh
        dst = qo_ptr + t * s_qot + head * s_qoh
        w_ptr = qw_ptr
    else:
        src = k_ptr + t * s_kt + (head - q_heads) * s_kh
        dst = ko_ptr + t * s_kot + (head - q_heads) * s_koh
        w_ptr = kw_ptr
    d = tl.arange(0, BLOCK_D)
    mask = d < dim
    half = dim // 2
    partner = tl.where(d < half, d + half, d - half)
    inv = 0.0
    if NORM:
        x32 = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x32 * x32, axis=0) / dim + eps)
    x = _normed(src, w_ptr, d, mask, inv, NORM)
    rotated = _normed(src, w_ptr, partner, mask, inv, NORM)
    rotated = tl.where(d < half, -rotated, rotated)
    cos = tl.load(cos_ptr + t * s_ct + d, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * s_st + d, mask=mask, other=0.0).to(tl.float32)
    dtype = dst.dtype.element_ty
    out = ((x * cos).to(dtype).to(tl.float32) + (rotated * sin).to(dtype).to(tl.float32)).to(dtype)
    tl.store(dst + d, out, mask=mask)
    if STORE:
        if head >= q_heads:  # the k row just stored, exactly as write_kv would read it back
            kv_head = head - q_heads
            slot = tl.load(slot_ptr + t).to(tl.int64)
            store_kv_row(
                out,
                v_ptr + t * s_vt + kv_head * s_vh,
                kc_ptr,
                vc_ptr,
                cent_ptr,
                slot,
                kv_head,
                dim,
                s_page,
                s_offset,
                s_head,
                s_cent_page,
                s_cent_head,
                PAGE,
                BLOCK_D,
                True,
            )
    if PDL:  # let the next kernel launch (its programs place as these leave)
        gdc_launch_dependents()


def qk_norm_rope_reference(q, k, cos, sin, q_weight, k_weight, eps):
    """The decoder's q/k RMSNorm (when weights are given) then rotate-half RoPE."""
    if q_weight is not None:
        q, k = rms_norm_reference(q, q_weight, eps), rms_norm_reference(k, k_weight, eps)
    half = q.shape[-1] // 2

    def rotate(x):
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    return rotate(q), rotate(k)


def _check(q, k, cos, sin, q_weight, k_weight, v, store) -> None:
    check(
        q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2],
        f"q and k must be [T, H, D] with one T and D, got {tuple(q.shape)} and {tuple(k.shape)}",
    )
    tokens, _, dim = q.shape
    check(dim % 2 == 0, f"head dim must be even for rotate-half RoPE, got {dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        check(
            tuple(t.shape) == (tokens, 1, dim),
            f"{name} must be [{tokens}, 1, {dim}], got {tuple(t.shape)}",
        )
    check((q_weight is None) == (k_weight is None), "give both q_weight and k_weight or neither")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check(
            w is None or tuple(w.shape) == (dim,),
            f"{name} must be [{dim}], got {None if w is None else tuple(w.shape)}",
        )
    check(
        (v is None) == (store is None),
        "give v and store (the values to store and where) together or neither",
    )
    if store is not None:
        check(isinstance(store, KVStore), f"store must be a KVStore, got {type(store).__name__}")
        store.check(k, v)


def _store_args(
    store: KVStore | None, v: torch.Tensor | None, stand_in: torch.Tensor
) -> tuple[tuple, tuple]:
    """The kernel's store pointers (v, caches, centroids, slots) and strides (v's, then the
    store's); without a store, stand_in fills the pointers (never read) and 0 the strides."""
    if store is None:
        return (stand_in,) * 5, (0,) * 7
    return (v, *store.tensors), (v.stride(0), v.stride(1), *store.strides)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    v: torch.Tensor | None = None,
    store: KVStore | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) normed per head (if weights are given) and rotated; new tensors, same shapes.
    With v and store, the rotated k and v are also stored at store.slots (decode)."""
    _check(q, k, cos, sin, q_weight, k_weight, v, store)
    weights = () if q_weight is None else (q_weight, k_weight)
    stored = () if store is None else (v, *store.tensors)
    same_dtype = all(t.dtype == q.dtype for t in (k, cos, sin, *weights))
    if (
        not same_dtype
        or not use_kernel(q, k, cos, sin, *weights, *stored)
        or needs_autograd(q, k, *weights)
    ):
        q_out, k_out = qk_norm_rope_reference(q, k, cos, sin, q_weight, k_weight, eps)
        if store is not None:  # the launcher, not its reference: equal to the unfused pair
            write_kv(*store.tensors, k_out, v)
        return q_out, k_out
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_last_dim_contiguous(name, t)
    tokens, q_heads, dim = q.shape
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    norm = q_weight is not None
    pointers, strides = _store_args(store, v, q)
    if tokens:
        pdl = pdl_launch(q.device, "attention")
        _qk_norm_rope_kernel[(tokens, q_heads + k.shape[1])](
            q,
            k,
            q_weight if norm else q,
            k_weight if norm else k,
            cos,
            sin,
            q_out,
            k_out,
            *pointers,
            q_heads,
            dim,
            eps,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            sin.stride(0),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            *strides,
            NORM=norm,
            STORE=store is not None,
            PAGE=1 if store is None else store.k_cache.shape[2],
            BLOCK_D=next_power_of_2(dim),
            PDL=pdl,
            num_warps=1,
            launch_pdl=pdl,
        )
    return q_out, k_out
