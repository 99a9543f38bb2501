"""Decode on GPU: the Triton-kernel attention of one step and CUDA graphs per batch size.

    graphs = DecodeGraphs(model, cache)                  # the runner builds one on CUDA
    logits = graphs.decode(ids, positions, slots, tables, topk, schedule)   # numpy inputs
    logits = graphs.decode(device_ids, positions, ...)   # ids of a step still in flight

KernelDecodeAttention is the GPU twin of step_attention.PagedAttention for a decode step:
per layer the KV write with the centroid of a page it fills, then dense split-K paged
attention, or (sparse layers) page scoring, top-k selection and block-sparse attention. The
KV write rides in the layer's q/k norm + RoPE kernel: the attention offers each layer's cache
as a KVStore (its `kv_store`, the optional half of model.layers.AttentionFn) and its call
then skips write_kv for that layer, one launch per layer fewer; `fuse_kv_write=False` keeps
write_kv as a launch of its own (benchmarks compare the two). Its metadata
lives in static buffers, so a whole decode forward (embedding, every layer, logits) is
captured once per (batch bucket, page-table width bucket, sparsity layout) and replayed:
no Python runs per layer per step. The batch is padded to its bucket with rows that write
nothing (slot -1) and read nothing (0 tokens); the page-table width to a power of two (the
kernels cut their work by the run-time token counts, not by the width). The schedule's
per-bin top-k travels in a buffer; its reserved pages and dense layers are fixed per graph.
`use_graphs=False` runs the same kernels eagerly (benchmarks, debugging). Centroids are
read and written in the cache's centroid dtype (EngineConfig.centroid_dtype; float8 rounds
as KVCache.update_centroids does, kernels/kv_write.py), so both paths select the same pages.
Inputs go up through pinned memory with non_blocking copies and the ids may come as a device
tensor, so a decode launch never waits for the GPU: the engine queues step t+1 while step t
still runs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from sparrow.engine.kv_cache import KVCache
from sparrow.kernels.kv_write import KVStore, write_kv
from sparrow.kernels.page_bounds import update_page_bounds
from sparrow.kernels.page_topk import read_every_page_lists, select_page_lists
from sparrow.kernels.paged_decode import paged_decode_attention, sparse_paged_decode_attention
from sparrow.kernels.runtime import next_power_of_2
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import get_rule

MIN_WIDTH = 64  # smallest page-table width bucket (1,024 tokens at 16 per page)


def batch_bucket(batch: int) -> int:
    """Padded batch size: 1, 2, 4, 8, then multiples of 8 up to 64, then of 32."""
    if batch <= 8:
        return next_power_of_2(batch)
    step = 8 if batch <= 64 else 32
    return -(-batch // step) * step


def width_bucket(width: int) -> int:
    return max(MIN_WIDTH, next_power_of_2(width))


def sparsity_key(schedule: Schedule | None, num_layers: int) -> tuple | None:
    """What a captured graph fixes of a schedule (top-k values travel in a buffer): page
    size, reserved pages, sparse layers; then, unless the centroid rule without dense heads,
    the scoring rule and the dense heads."""
    if schedule is None:
        return None
    sparse = tuple(schedule.is_sparse_layer(i) for i in range(num_layers))
    if not any(sparse):
        return None
    key = (schedule.page_size, schedule.reserved_bos, schedule.reserved_eos, sparse)
    if schedule.selection != "centroid" or schedule.dense_heads:
        key += (schedule.selection, schedule.dense_heads)
    return key


class KernelDecodeAttention:
    """attention(layer, q, k, v) for one decode step over (static) metadata tensors.

    Each layer's k, v are written exactly once: by the layer's qk_norm_rope when its store
    was taken (kv_store) since the layer's last call, else by write_kv in the call. A second
    kv_store for a layer before its call is refused (the k, v would be stored twice)."""

    def __init__(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        page_tables: torch.Tensor,
        num_tokens: torch.Tensor,
        topk: torch.Tensor,
        sparsity: tuple | None,
        fuse_kv_write: bool = True,
    ):
        self.cache, self.slots, self.page_tables = cache, slots, page_tables
        self.num_tokens, self.topk, self.sparsity = num_tokens, topk, sparsity
        self.fuse_kv_write = fuse_kv_write
        self._stored: set[int] = set()  # layers whose store was taken and not yet called

    def kv_store(self, layer: int) -> KVStore | None:
        """Where the layer's qk_norm_rope stores its k, v (None with fuse_kv_write off)."""
        if not self.fuse_kv_write:
            return None
        if layer in self._stored:
            raise RuntimeError(f"layer {layer}'s KV store was already taken for this step")
        self._stored.add(layer)
        cache = self.cache
        return KVStore(cache.k[layer], cache.v[layer], cache.centroids[layer], self.slots)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cache = self.cache
        k_pages, v_pages, centroids = cache.k[layer], cache.v[layer], cache.centroids[layer]
        if layer in self._stored:  # qk_norm_rope has stored them
            self._stored.remove(layer)
        else:
            write_kv(k_pages, v_pages, centroids, self.slots, k, v)
        if self.sparsity is None or not self.sparsity[3][layer]:
            return paged_decode_attention(q, k_pages, v_pages, self.page_tables, self.num_tokens)
        page_size, reserved_bos, reserved_eos = self.sparsity[:3]
        selection, dense_heads = self.sparsity[4:] or ("centroid", ())
        bounds = get_rule(selection).bounds
        if bounds:
            update_bounds(cache, layer, self.slots)
        lists, counts, _ = select_page_lists(
            q,
            cache.bounds[layer] if bounds else centroids,
            self.page_tables,
            self.num_tokens,
            self.topk,
            page_size,
            reserved_bos,
            reserved_eos,
            selection=selection,
        )
        heads = tuple(head for at, head in dense_heads if at == layer)
        lists, counts = read_every_page_lists(lists, counts, self.num_tokens, page_size, heads)
        return sparse_paged_decode_attention(
            q, k_pages, v_pages, self.page_tables, self.num_tokens, lists, counts
        )


def update_bounds(cache: KVCache, layer: int, slots: torch.Tensor) -> None:
    """The key bounds of the pages this step's tokens fill (kernels/page_bounds.py: one
    launch on a GPU, capturable torch ops elsewhere)."""
    update_page_bounds(cache.k[layer], cache.bounds[layer], slots)


def cache_layout(cache: KVCache) -> tuple:
    """Where and how the cache's tensors lie: a captured graph holds these addresses."""
    tensors = (cache.k, cache.v, cache.centroids)
    if cache.bounds is not None:
        tensors += (cache.bounds,)
    return tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in tensors)


class DecodeGraphs:
    """Static decode buffers and one CUDA graph per (batch bucket, width bucket, sparsity).

    The graphs outlive the KV cache: the engine's sleep lets the cache go (release_cache) and
    keeps the graphs, their memory pool and the static buffers; wake hands the new cache over
    (attach), and the graphs are replayed as they are when it lies at the same addresses with
    the same shapes, else dropped and captured again. The cache is allocated in torch's
    expandable segments (KVCache.allocate), which keep their address range through the
    sleep's empty_cache and map the next cache of the same shape at the same addresses. The weights are the model's own tensors, updated in place
    (Decoder.load_hf_state_dict), so a weight update leaves the graphs valid."""

    def __init__(
        self,
        model: torch.nn.Module,
        cache: KVCache,
        use_graphs: bool = True,
        fuse_kv_write: bool = True,
    ):
        self.model, self.cache, self.use_graphs = model, cache, use_graphs
        self.fuse_kv_write = fuse_kv_write  # the KV write inside qk_norm_rope's launch
        self.device = cache.k.device
        self.num_layers = cache.num_layers
        self.capacity = 0
        self.tables: dict[int, torch.Tensor] = {}
        self.graphs: dict[tuple, tuple[Any, torch.Tensor]] = {}
        self.pool = None
        self.released_layout: tuple | None = None  # the cache's, while the engine sleeps
        self.kept_wakes = 0  # attaches that kept the graphs
        self.capture_seconds = 0.0  # spent warming up and capturing (benchmarks subtract it)

    def _ensure_capacity(self, batch: int, width: int) -> None:
        if batch <= self.capacity and width in self.tables:
            return
        if batch > self.capacity:  # new buffers: every graph captured so far is stale
            self.capacity = max(batch, 2 * self.capacity, 8)
            make = lambda dtype: torch.zeros(self.capacity, dtype=dtype, device=self.device)
            self.ids, self.positions, self.slots = (
                make(torch.long),
                make(torch.long),
                make(torch.long),
            )
            self.num_tokens, self.topk = make(torch.int32), make(torch.int32)
            self.tables = {}
            self.clear()
        if width not in self.tables:
            self.tables[width] = torch.zeros(
                self.capacity, width, dtype=torch.int32, device=self.device
            )

    def clear(self) -> None:
        """Drop every captured graph and their memory pool (the next decode recaptures)."""
        self.graphs.clear()
        self.pool = None

    def release_cache(self) -> None:
        """Let go of the KV cache (the engine sleeps); the graphs stay."""
        self.released_layout, self.cache = cache_layout(self.cache), None

    def attach(self, cache: KVCache) -> bool:
        """Decode into `cache` from now on. The graphs are kept when it has the released
        cache's layout (True), else dropped."""
        kept = cache_layout(cache) == self.released_layout
        if not kept:
            self.clear()
        self.kept_wakes += kept
        self.cache, self.released_layout = cache, None
        return kept

    def _forward(self, bucket: int, width: int, sparsity: tuple | None) -> torch.Tensor:
        attention = KernelDecodeAttention(
            self.cache,
            self.slots[:bucket],
            self.tables[width][:bucket],
            self.num_tokens[:bucket],
            self.topk[:bucket],
            sparsity,
            self.fuse_kv_write,
        )
        hidden = self.model(self.ids[:bucket], self.positions[:bucket], attention)
        return self.model.compute_logits(hidden)

    def _neutral(self) -> None:
        """Inputs that touch no cache slot (used while warming up and capturing)."""
        self.slots.fill_(-1)
        self.num_tokens.zero_()
        self.ids.zero_()
        self.positions.zero_()

    def _capture(self, key: tuple) -> tuple[Any, torch.Tensor]:
        bucket, width, sparsity = key
        self._neutral()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compiles the kernels, settles lazy allocations
            for _ in range(2):
                self._forward(bucket, width, sparsity)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(bucket, width, sparsity)
        return graph, logits

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device without waiting for the stream: a pinned staging copy
        (the host allocator keeps the block until the copy has run)."""
        staged = torch.from_numpy(array)
        if self.device.type != "cuda":  # the Triton interpreter on CPU (tests)
            return staged.to(self.device)
        return staged.pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def decode(
        self,
        ids: np.ndarray | torch.Tensor,
        positions: np.ndarray,
        slots: np.ndarray,
        tables: np.ndarray,
        topk: np.ndarray | None,
        schedule: Schedule | None,
    ) -> torch.Tensor:
        """Logits [B, vocab] float32 of one decode step; tables [B, w] physical page ids;
        ids [B] as numpy or as a device tensor (the tokens a step still in flight samples)."""
        batch, width = tables.shape
        bucket, wide = batch_bucket(batch), width_bucket(width)
        sparsity = sparsity_key(schedule, self.num_layers) if topk is not None else None
        self._ensure_capacity(bucket, wide)
        key = (bucket, wide, sparsity)
        if self.use_graphs and key not in self.graphs:
            started = time.perf_counter()
            self.graphs[key] = self._capture(key)
            torch.cuda.synchronize(self.device)
            self.capture_seconds += time.perf_counter() - started
        rows = np.zeros((5, bucket), dtype=np.int64)
        rows[2] = -1  # padded rows write nowhere
        on_device = isinstance(ids, torch.Tensor)
        if not on_device:
            rows[0, :batch] = ids
        rows[1, :batch], rows[2, :batch] = positions, slots
        rows[3, :batch] = positions + 1  # cached tokens, the current one included
        if topk is not None:
            rows[4, :batch] = topk
        staged = self._upload(rows)
        self.ids[:bucket].copy_(staged[0])  # padded rows read token 0
        if on_device:
            self.ids[:batch].copy_(ids)
        self.positions[:bucket].copy_(staged[1])
        self.slots[:bucket].copy_(staged[2])
        self.num_tokens[:bucket].copy_(staged[3])
        self.topk[:bucket].copy_(staged[4])
        padded = np.zeros((bucket, wide), dtype=np.int32)
        padded[:batch, :width] = tables
        self.tables[wide][:bucket].copy_(self._upload(padded))
        if not self.use_graphs:
            return self._forward(bucket, wide, sparsity)[:batch]
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:batch].clone()
