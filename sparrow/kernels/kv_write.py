"""KV cache write with the page centroid fused in: store a step's k, v; when a token fills
its page, store the page's centroid (the float32 mean of its keys, stored in the centroids'
dtype) in the same kernel.

    write_kv(k_cache, v_cache, centroids, slots, k, v)                    # decode (fused)
    write_kv(k_cache, v_cache, centroids, slots, k, v, update_centroids=False)   # prefill
    store = KVStore(k_cache, v_cache, centroids, slots)   # the same target, for another kernel

One layer: k_cache, v_cache [P, Hkv, page_size, D] (head-major); centroids [P, Hkv, D] float32,
the cache dtype or float8_e4m3fn (EngineConfig.centroid_dtype); slots [T] flat slots page * page_size + offset (a negative slot is
skipped: padded batch rows); k, v [T, Hkv, D]. With update_centroids, a token written at
offset page_size - 1 also sets its page's centroid from the page's earlier keys (already in
the cache, written by earlier steps) and its own key as stored (rounded to the cache dtype),
which is the reference's KVCache.update_centroids for the pages a decode step fills. Tokens
of one page written by the same launch (prefill) would race on the centroid, so prefill
writes without it and computes the filled pages' centroids afterwards
(KVCache.update_centroids).

qk_norm_rope can do a decode step's write itself, in its own launch: given a KVStore, its
k-head programs store the rotated k and v through `store_kv_row`, the Triton function this
kernel uses, so both round and average alike; KVStore.check holds both launchers' checks.
The mean is rounded once from float32 to the centroids' dtype (`round_centroids`, the
reference's rule): round to nearest even; into float8_e4m3fn also saturating at +-448, as
torch's CPU cast and Hopper's `cvt.rn.satfinite` do (the clamp holds it on every torch
version). The kernel rounds to float8 by bit arithmetic (`fp32_to_e4m3fn`): Triton's
interpreter casts to float8 rounding half up and flushing subnormals, so a plain `.to()` would
make the CPU tests disagree with the GPU; the bit form gives the same bits on both.
Tests: `python -m pytest tests/kernels -q`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparrow.kernels.runtime import (
    check,
    check_integer,
    check_last_dim_contiguous,
    jit,
    next_power_of_2,
    tl,
    use_kernel,
)

FLOAT8_CENTROIDS = torch.float8_e4m3fn
FLOAT8_MAX = 448.0  # the largest finite float8_e4m3fn


def round_centroids(mean: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Centroids from their float32 means, rounded once to `dtype` (nearest even; float8
    saturates at +-448). Every path that stores or replays centroids rounds through here."""
    if dtype == FLOAT8_CENTROIDS:
        mean = mean.float().clamp(-FLOAT8_MAX, FLOAT8_MAX)
    return mean.to(dtype)


@jit
def fp32_to_e4m3fn(x):
    """float32 -> float8_e4m3fn bits as round_centroids gives them: nearest even, subnormals
    kept, +-448 past the range, NaN kept (c10's conversion, in integer arithmetic)."""
    bits = x.to(tl.int32, bitcast=True)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    magnitude = tl.minimum(bits & 0x7FFFFFFF, 0x43F00000)  # 480: past it, 448 all the same
    # normal (|x| >= 2^-6): drop 20 mantissa bits rounding to even, rebias the exponent 127 -> 7
    normal = ((magnitude + ((magnitude >> 20) & 1) + 0x7FFFF) >> 20) - (120 << 3)
    # subnormal: the float32 add of 2^14 rounds to a multiple of 2^-9 (the float8 unit there)
    tiny = (magnitude.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True)
    code = tl.where(magnitude < 0x3C800000, tiny - 0x46800000, tl.minimum(normal, 0x7E))
    code = tl.where(nan, 0x7F, code) | tl.where(bits < 0, 0x80, 0)
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@jit
def store_kv_row(
    key,
    value_ptr,
    kc_ptr,
    vc_ptr,
    cent_ptr,
    slot,
    head,
    dim,
    s_page,
    s_offset,
    s_head,
    s_cent_page,
    s_cent_head,
    PAGE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FUSE: tl.constexpr,
):
    """One token's key (a [BLOCK_D] row held in registers) and value row (at value_ptr) of KV
    head `head` into the caches at slot, nothing when slot < 0; with FUSE, its page's
    centroid when the token fills the page."""
    live = slot >= 0
    page = slot // PAGE
    offset = slot % PAGE
    d = tl.arange(0, BLOCK_D)
    dmask = (d < dim) & live
    value = tl.load(value_ptr + d, mask=dmask, other=0.0)
    key = key.to(kc_ptr.dtype.element_ty)
    dest = page * s_page + offset * s_offset + head * s_head + d
    tl.store(kc_ptr + dest, key, mask=dmask)
    tl.store(vc_ptr + dest, value.to(vc_ptr.dtype.element_ty), mask=dmask)
    if FUSE:
        fills = live & (offset == PAGE - 1)
        rows = tl.arange(0, PAGE)
        earlier = tl.load(
            kc_ptr + page * s_page + rows[:, None] * s_offset + head * s_head + d[None, :],
            mask=(rows < PAGE - 1)[:, None] & (d < dim)[None, :] & fills,
            other=0.0,
        )
        total = tl.sum(earlier.to(tl.float32), axis=0) + key.to(tl.float32)
        # IEEE division, as torch's mean (a plain `/` compiles to the approximate div.full)
        mean = tl.div_rn(total, tl.full(total.shape, PAGE, tl.float32))
        if cent_ptr.dtype.element_ty == tl.float8e4nv:
            centroid = fp32_to_e4m3fn(mean)
        else:
            centroid = mean.to(cent_ptr.dtype.element_ty)
        tl.store(
            cent_ptr + page * s_cent_page + head * s_cent_head + d, centroid, mask=(d < dim) & fills
        )


@jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    cent_ptr,
    slot_ptr,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    s_cp,
    s_ct,
    s_ch,
    s_np,
    s_nh,
    dim,
    PAGE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FUSE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    key = tl.load(k_ptr + t * s_kt + h * s_kh + d, mask=(d < dim) & (slot >= 0), other=0.0)
    store_kv_row(
        key,
        v_ptr + t * s_vt + h * s_vh,
        kc_ptr,
        vc_ptr,
        cent_ptr,
        slot,
        h,
        dim,
        s_cp,
        s_ct,
        s_ch,
        s_np,
        s_nh,
        PAGE,
        BLOCK_D,
        FUSE,
    )


@dataclass(frozen=True)
class KVStore:
    """Where one layer's step k, v go: its caches, centroids and the tokens' flat slots.

    A decode target: the centroid of a page is set by the token that fills it, so no two
    tokens of one write may share a page (decode writes one token per sequence)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    centroids: torch.Tensor
    slots: torch.Tensor

    def check(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Refuse (KernelInputError naming the tensor) what the store kernels cannot take."""
        k_cache, v_cache, centroids, slots = self.k_cache, self.v_cache, self.centroids, self.slots
        check(
            k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
            f"k_cache and v_cache must share a shape [P, Hkv, page_size, D], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
        )
        pages, kv_heads, _, dim = k_cache.shape
        check(
            tuple(centroids.shape) == (pages, kv_heads, dim)
            and centroids.dtype in (torch.float32, k_cache.dtype, FLOAT8_CENTROIDS),
            f"centroids must be float32, {k_cache.dtype} or float8_e4m3fn "
            f"[{pages}, {kv_heads}, {dim}], got {tuple(centroids.shape)} {centroids.dtype}",
        )
        check(
            k.dim() == 3 and k.shape == v.shape and tuple(k.shape[1:]) == (kv_heads, dim),
            f"k and v must be [T, {kv_heads}, {dim}], got {tuple(k.shape)} and {tuple(v.shape)}",
        )
        check(
            tuple(slots.shape) == (k.shape[0],),
            f"slots must be [{k.shape[0]}], got {tuple(slots.shape)}",
        )
        check_integer("slots", slots)
        check(k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share strides")
        for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("centroids", centroids)):
            check_last_dim_contiguous(name, t)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.k_cache, self.v_cache, self.centroids, self.slots

    @property
    def strides(self) -> tuple[int, int, int, int, int]:
        """(page, offset, head) strides of the caches, (page, head) of the centroids."""
        return (
            self.k_cache.stride(0),
            self.k_cache.stride(2),
            self.k_cache.stride(1),
            self.centroids.stride(0),
            self.centroids.stride(1),
        )


def write_kv_reference(k_cache, v_cache, centroids, slots, k, v, update_centroids=True):
    """The cache's own semantics (KVCache.write, then update_centroids on filled pages)."""
    page_size = k_cache.shape[2]
    live = slots >= 0
    slots, k, v = slots[live].long(), k[live], v[live]
    page, offset = slots // page_size, slots % page_size
    k_cache[page, :, offset] = k.to(k_cache.dtype)  # [T, Hkv, D] at (page, head, offset)
    v_cache[page, :, offset] = v.to(v_cache.dtype)
    if update_centroids:
        filled = page[offset == page_size - 1]
        if filled.numel():
            centroids[filled] = round_centroids(
                k_cache[filled].float().mean(dim=2), centroids.dtype
            )


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    centroids: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    update_centroids: bool = True,
) -> None:
    """Store k, v at slots; with update_centroids, the centroid of each page a slot fills."""
    store = KVStore(k_cache, v_cache, centroids, slots)
    store.check(k, v)
    if not use_kernel(k_cache, centroids, slots, k, v):
        write_kv_reference(k_cache, v_cache, centroids, slots, k, v, update_centroids)
        return
    if k.shape[0] == 0:
        return
    _, kv_heads, page_size, dim = k_cache.shape
    _kv_write_kernel[(k.shape[0], kv_heads)](
        k,
        v,
        k_cache,
        v_cache,
        centroids,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *store.strides,
        dim,
        PAGE=page_size,
        BLOCK_D=next_power_of_2(dim),
        FUSE=update_centroids,
        num_warps=1,
    )
