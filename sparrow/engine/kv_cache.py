"""The paged KV cache: per layer keys, values and one centroid per page and KV head.

    cache = KVCache.allocate(arch, num_pages=64, page_size=16, dtype=torch.float32, device="cpu")
    cache = KVCache.allocate(..., centroid_dtype=torch.float8_e4m3fn)   # 8-bit centroids
    cache = KVCache.allocate(..., bounds=True)   # per-channel key bounds too (quest rules)
    cache.write(layer, slot_mapping, k, v)      # k, v: [T, Hkv, D] post-RoPE
    cache.update_centroids(layer, filled_pages) # once per page, when it fills (and bounds)

Storage: k and v [num_layers, num_pages, Hkv, page_size, D] in the model's dtype (head-major:
one KV head's page is one contiguous block, so a per-head page gather reads whole rows of
page_size * D elements); centroids [num_layers, num_pages, Hkv, D], the mean of the page's
keys (as stored) computed in float32 and rounded once (kernels/kv_write.py round_centroids)
to the centroid dtype: the cache dtype by default (bf16 on GPU halves the bytes scoring
reads against float32; float32 on CPU stays exact), or float8_e4m3fn with
EngineConfig.centroid_dtype (half again; the selection changes slightly).
With bounds, also bounds [num_layers, num_pages, 2, Hkv, D] in the cache dtype: the
per-channel min and max of the page's keys (sparse/scoring.py page_bounds; exact, nothing to
round), set with the centroid when the page fills; the quest rules score them.
A page's centroid is only meaningful once the page is full; selection never scores the
partial page (it is always read).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sparrow.cuda_memory import expandable_segments
from sparrow.engine.config import CENTROID_DTYPES, EngineConfig, EngineError
from sparrow.kernels.kv_write import round_centroids
from sparrow.sparse.scoring import page_bounds

if TYPE_CHECKING:
    from sparrow.model.config import ModelArch


def centroid_torch_dtype(name: str, cache_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of EngineConfig.centroid_dtype `name` for a cache of `cache_dtype`."""
    if name not in CENTROID_DTYPES:
        raise EngineError(
            f"centroid_dtype must be one of {', '.join(CENTROID_DTYPES)}, got {name!r}"
        )
    return cache_dtype if name == "cache" else getattr(torch, name)


def bytes_per_page(
    arch: ModelArch,
    page_size: int,
    dtype: torch.dtype,
    centroids: torch.dtype | None = None,
    bounds: bool = False,
) -> int:
    """Bytes one page costs over all layers: keys and values (cache dtype), the centroid
    (`centroids`, None: the cache dtype) and, with bounds, two key bounds (cache dtype)."""
    element = torch.empty((), dtype=dtype).element_size()
    centroid = torch.empty((), dtype=centroids or dtype).element_size()
    summary = centroid + (2 * element if bounds else 0)
    per_layer = arch.num_kv_heads * arch.head_dim * (2 * page_size * element + summary)
    return arch.num_layers * per_layer


# a cache sized from free memory takes this share of what fits, and keeps its size at later
# wakes until what fits grows past REGROW times it or falls below it
HEADROOM, REGROW = 0.98, 1.05


def pages_for_room(room: int, per_page: int, before: int = 0) -> int:
    """Pages of a cache sized from `room` free bytes, `before` the last one's (0: none). The
    last size while it fits and what fits is under REGROW times it, so the cache keeps its
    shape from wake to wake (kept decode graphs replay, engine/cuda_graphs.py); else HEADROOM
    of what fits, which small swings in free memory leave standing."""
    fits = room // per_page
    if 0 < before <= fits < REGROW * before:
        return before
    return max(1, int(fits * HEADROOM))


def pages_for_budget(
    arch: ModelArch,
    page_size: int,
    dtype: torch.dtype,
    mib: float,
    centroids: torch.dtype | None = None,
    bounds: bool = False,
) -> int:
    per_page = bytes_per_page(arch, page_size, dtype, centroids, bounds)
    pages = int(mib * 2**20) // per_page
    if pages < 1:
        raise EngineError(
            f"kv_cache_mib={mib} holds no KV page: one page of {page_size} tokens needs "
            f"{per_page} bytes for this model"
        )
    return pages


@dataclass
class KVCache:
    k: torch.Tensor
    v: torch.Tensor
    centroids: torch.Tensor
    bounds: torch.Tensor | None = None  # [layers, P, 2, Hkv, D] when a quest rule reads them

    @classmethod
    def allocate(
        cls,
        arch: ModelArch,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        centroid_dtype: torch.dtype | None = None,
        bounds: bool = False,
    ) -> KVCache:
        """Zeroed keys and values in `dtype`, centroids in `centroid_dtype` (None: `dtype`),
        with `bounds` the per-channel key bounds in `dtype`. On CUDA in expandable segments: a
        cache allocated again after the engine's sleep lies where the last one did, so kept
        decode graphs replay (engine/cuda_graphs.py)."""
        shape = (arch.num_layers, num_pages, arch.num_kv_heads, page_size, arch.head_dim)
        summary = shape[:2] + (2,) + shape[2:3] + shape[4:]
        with expandable_segments(device):
            return cls(
                k=torch.zeros(shape, dtype=dtype, device=device),
                v=torch.zeros(shape, dtype=dtype, device=device),
                centroids=torch.zeros(
                    shape[:3] + shape[4:], dtype=centroid_dtype or dtype, device=device
                ),
                bounds=torch.zeros(summary, dtype=dtype, device=device) if bounds else None,
            )

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[3]

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store k, v [T, Hkv, D] at flat slots page * page_size + offset."""
        if k.shape != v.shape or k.shape[0] != slot_mapping.shape[0]:
            raise ValueError(
                f"k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping "
                f"{tuple(slot_mapping.shape)} disagree"
            )
        page, offset = slot_mapping // self.page_size, slot_mapping % self.page_size
        # [page, :, offset] puts the token dim first: [T, Hkv, D], the shape of k and v
        self.k[layer][page, :, offset] = k.to(self.k.dtype)
        self.v[layer][page, :, offset] = v.to(self.v.dtype)

    def update_centroids(self, layer: int, pages: torch.Tensor) -> None:
        """Centroid of each listed (full) page: the float32 mean of its keys, rounded once to
        the centroids' dtype; and its key bounds when the cache keeps them."""
        if pages.numel():
            mean = self.k[layer, pages].float().mean(dim=2)
            self.centroids[layer, pages] = round_centroids(mean, self.centroids.dtype)
            if self.bounds is not None:
                # [F, Hkv, page_size, D] -> tokens at dim -3, as page_bounds takes them
                self.bounds[layer, pages] = page_bounds(self.k[layer, pages].transpose(1, 2))

    def copy_pages(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Copy keys, values and centroids from source to destination page, every layer."""
        pairs = list(pairs)
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.k.device)
        dst = torch.tensor([d for _, d in pairs], device=self.k.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
        self.centroids[:, dst] = self.centroids[:, src]
        if self.bounds is not None:
            self.bounds[:, dst] = self.bounds[:, src]


def pages_from_memory(
    arch: ModelArch,
    config: EngineConfig,
    weight: torch.Tensor,
    centroids: torch.dtype,
    bounds: bool,
    before: int,
) -> int:
    """Pages that bring the device's used memory to config.memory_utilization of its total,
    `before` (the last wake's count) while it fits (pages_for_room); 0 when the setting is
    off, off CUDA or with num_pages set."""
    share = config.memory_utilization
    if not share or weight.device.type != "cuda" or config.num_pages:
        return 0
    free, total = torch.cuda.mem_get_info(weight.device)
    room = int(share * total) - (total - free)
    per_page = bytes_per_page(arch, config.page_size, weight.dtype, centroids, bounds)
    if room < per_page:
        raise EngineError(
            f"memory_utilization={share} leaves no room for the KV cache: "
            f"{(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB already in use"
        )
    return pages_for_room(room, per_page, before)
