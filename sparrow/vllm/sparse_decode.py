"""Block-sparse decode over vLLM's KV cache: the pure parts of the sparse vLLM backend.

    split = split_batch(query_start_loc, is_prefilling)        # host: decode rows come first
    rows, pages = filled_pages(query_start_loc, seq_lens, 16)  # host: pages this step fills
    update_centroids(key_cache, centroids, block_table[rows, pages])
    sparsity = layer_sparsity(schedule, layer, device)         # None: the layer decodes densely
    out = decode_attention(q, key_cache, value_cache, centroids, block_table, seq_lens, sparsity)

vLLM 0.23.0's FLASH_ATTN cache (the layout sparse_backend.py keeps) holds one layer as
kv_cache [num_blocks, 2, block_size, Hkv, D]; key_cache, value_cache = kv_cache.unbind(1) are
token-major [num_blocks, block_size, Hkv, D]. The project's decode kernels read pages through
strides, so the head-major view key_cache.transpose(1, 2) [num_blocks, Hkv, block_size, D]
(last dimension contiguous) is the native cache's layout without a copy. A vLLM block is the
native page (block_size 16 = schedule.page_size); a request's row of vLLM's block table is its
page table, and its seq_len (the current token included) the native num_tokens.

The selection is the native engine's (engine/step_attention.py, sparse/selection.py): the
decode query at position seq_len - 1 takes the top-k of its length bin, reserved_bos first
and reserved_eos last pages always read, dense layers (skip_layers) read every page. Centroids
are the float32 mean of a full page's keys as stored, rounded once to the centroids' dtype
(kernels/kv_write.py round_centroids), set when the page fills: every page a step's tokens
complete (prefill chunks and decode alike), read back from the cache after vLLM wrote them.
Nothing here imports vllm: tests hold it to the native engine on CPU
(tests/vllm/test_sparse_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparrow.kernels.kv_write import round_centroids
from sparrow.kernels.page_topk import select_page_lists
from sparrow.kernels.paged_decode import paged_decode_attention, sparse_paged_decode_attention
from sparrow.sparse.schedule import Schedule


@dataclass(frozen=True)
class BatchSplit:
    """vLLM's reordered batch: decode rows [0, num_decodes) with one query token each, then
    prefill rows (first chunks, later chunks, a last chunk of one token) up to num_reqs."""

    num_decodes: int
    num_prefill_tokens: int

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes


def split_batch(query_start_loc: torch.Tensor, is_prefilling: torch.Tensor | None) -> BatchSplit:
    """Decode rows: the leading rows whose one query token follows a finished prompt.

    query_start_loc [R + 1] and is_prefilling [R] are host tensors. A one-token chunk of a
    prompt is prefill (dense, as the native engine's whole-prompt prefill): vLLM places such
    rows after the decodes, and is_prefilling tells them apart (None: every leading
    one-token row decodes). Rows with no token (vLLM's padding) count as neither."""
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
    prefilling = [False] * len(query_lens) if is_prefilling is None else is_prefilling.tolist()
    decodes = 0
    while decodes < len(query_lens) and query_lens[decodes] == 1 and not prefilling[decodes]:
        decodes += 1
    return BatchSplit(decodes, sum(query_lens[decodes:]))


def filled_pages(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, logical pages) of the pages this step's tokens complete, as long host tensors.

    Row r writes positions [seq_len - query_len, seq_len); page j is complete when its last
    position (j + 1) * page_size - 1 is among them. Gather the physical ids with
    block_table[rows, pages] (one gather per step, shared by every layer)."""
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    ends = seq_lens[: query_lens.shape[0]].long()
    starts = ends - query_lens
    # page j is complete when start <= (j + 1) * page_size - 1 < end
    lo = starts // page_size
    hi = ends // page_size  # exclusive
    counts = (hi - lo).clamp(min=0)
    rows = torch.repeat_interleave(torch.arange(query_lens.shape[0]), counts)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(
        counts.cumsum(0) - counts, counts
    )
    return rows, lo[rows] + offsets


def update_centroids(key_cache: torch.Tensor, centroids: torch.Tensor, pages: torch.Tensor) -> None:
    """Centroids of the listed full pages: key_cache one layer [num_blocks, block_size, Hkv,
    D] (vLLM's token-major keys), centroids [num_blocks, Hkv, D]; pages [F] physical ids."""
    if pages.numel():
        pages = pages.to(key_cache.device).long()
        mean = key_cache[pages].float().mean(dim=1)  # [F, Hkv, D]
        centroids[pages] = round_centroids(mean, centroids.dtype)


@dataclass(frozen=True)
class LayerSparsity:
    """What one sparse layer's decode needs of a schedule: the per-bin top-k on the device
    and the reserved pages."""

    topk_per_bin: torch.Tensor
    bin_tokens: int
    page_size: int
    reserved_bos: int
    reserved_eos: int

    def topk(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Top-k of each decode row, from the bin of its position seq_len - 1 (no host sync)."""
        bins = ((seq_lens.long() - 1) // self.bin_tokens).clamp(0, self.topk_per_bin.numel() - 1)
        return self.topk_per_bin[bins]


def layer_sparsity(
    schedule: Schedule | None, layer: int, device: torch.device | str
) -> LayerSparsity | None:
    """The layer's sparsity under `schedule`; None when it decodes densely (no schedule, or
    the layer is among skip_layers)."""
    if schedule is None or not schedule.is_sparse_layer(layer):
        return None
    if schedule.selection != "centroid" or schedule.dense_heads:
        # the plugin scores centroids only (docs/selection.md): refuse rather than decode
        # with another rule than the schedule was calibrated for
        raise ValueError(
            f"schedule {schedule.name!r}: the vLLM plugin decodes with selection 'centroid' "
            f"and no dense_heads only, got {schedule.selection!r}, {list(schedule.dense_heads)}"
        )
    table = torch.tensor(schedule.topk_pages, dtype=torch.int32, device=device)
    return LayerSparsity(
        table, schedule.bin_tokens, schedule.page_size, schedule.reserved_bos, schedule.reserved_eos
    )


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] -> the kernels' [num_blocks, Hkv, block_size, D] view."""
    return cache.transpose(1, 2)


def decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    centroids: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sparsity: LayerSparsity | None,
    selection: list | None = None,
) -> torch.Tensor:
    """One decode token per row: q [B, Hq, D] over each row's cached tokens (seq_lens [B],
    block_table [B, W]); dense without sparsity, else block-sparse over the selected pages.
    With `selection` (a list), the [B, Hkv, W] page mask is appended to it (tests)."""
    k_pages, v_pages = head_major(key_cache), head_major(value_cache)
    if sparsity is None:
        return paged_decode_attention(q, k_pages, v_pages, block_table, seq_lens)
    if sparsity.page_size != key_cache.shape[1]:
        raise ValueError(
            f"the schedule's page_size {sparsity.page_size} differs from vLLM's "
            f"block_size {key_cache.shape[1]}"
        )
    lists, counts, mask = select_page_lists(
        q,
        centroids,
        block_table,
        seq_lens,
        sparsity.topk(seq_lens),
        sparsity.page_size,
        sparsity.reserved_bos,
        sparsity.reserved_eos,
        want_mask=selection is not None,
    )
    if selection is not None:
        selection.append(mask)
    return sparse_paged_decode_attention(q, k_pages, v_pages, block_table, seq_lens, lists, counts)
