"""Teacher-forced block-sparse attention on GPU: FlexAttention over a per-query page bitmap.

    out = sparse_flex_attention(q, k, v, select_chunks(...), page_size)   # one sequence
    # q [T, Hq, D]; k, v [T, Hkv, D]; out [T, Hq, D] in q's dtype, differentiable in q, k, v

Every position t reads, per KV head, its own pages (teacher_selection.select_chunks) and
causally the tokens before it. The pages go into a bitmap, one bit per (KV head, position,
page): [Hkv, T, P / 8] uint8, 1/8 of a bool mask and T * T / (16 * 8) bytes per KV head
(64 MiB for a 32K sequence over 8 KV heads), built chunk by chunk as the selection comes.
FlexAttention (torch.nn.attention.flex_attention, compiled: torch.compile writes one Triton
kernel, forward and backward) reads it in its mask_mod; the BlockMask, 128 x 128 tokens,
comes from the same chunks: a KV block no position of a query block reads is skipped, one
every position reads whole (and before the diagonal) is a full block that skips the
mask_mod. Grouped-query heads through enable_gqa (no copy of k, v). Off CUDA, FlexAttention
runs eagerly (the unfused math form, forward only: torch has no FlexAttention backward on
CPU); that is how the CPU tests hold this path equal to the reference. Dense sequences and
layers go to SDPA (kernels/prefill.py). TeacherForcedAttention dispatches here on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    HAS_FLEX = True
except ImportError:  # an old torch: the reference path serves
    HAS_FLEX = False

BLOCK = 128  # BlockMask tile (query and KV tokens); FlexAttention's default
_COMPILED: dict[str, object] = {}


def selection_rows(num_kv_heads: int, length: int, page_size: int, budget: int = 1 << 24) -> int:
    """Positions per selection chunk: a multiple of BLOCK with [rows, Hkv, P] scores of
    about `budget` float32 elements (64 MiB) at most."""
    width = -(-length // page_size)
    rows = budget // max(1, num_kv_heads * width) // BLOCK * BLOCK
    return max(BLOCK, rows)


def sparse_flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunks: Iterable[tuple[int, int, torch.Tensor]],
    page_size: int,
    on_pages=None,
) -> torch.Tensor:
    """Attention of one sequence where position t reads its chunk row's pages (see the
    module docstring); chunks come in order, each a multiple of BLOCK rows but the last.
    on_pages, if given, receives each chunk's page mask (tests)."""
    _check(q, k, v, page_size)
    length, kv_heads = k.shape[:2]
    bitmap = PageBitmap(length, kv_heads, page_size, q.device)
    for first, last, pages in chunks:
        bitmap.add(first, last, pages)
        if on_pages is not None:
            on_pages(pages)
    block_mask = bitmap.block_mask(q.shape[1] // kv_heads)
    heads_first = [t.transpose(0, 1).unsqueeze(0) for t in (q, k.to(q.dtype), v.to(q.dtype))]
    out = _flex(q.is_cuda)(
        *heads_first, block_mask=block_mask, enable_gqa=True, scale=1.0 / math.sqrt(q.shape[-1])
    )
    return out[0].transpose(0, 1)


class PageBitmap:
    """The pages every position of one sequence reads, as bits, with per-block summaries."""

    def __init__(self, length: int, kv_heads: int, page_size: int, device: torch.device):
        self.length, self.kv_heads, self.page_size = length, kv_heads, page_size
        self.q_blocks = self.kv_blocks = -(-length // BLOCK)
        self.pages_per_block = BLOCK // page_size
        width_bytes = -(-self.kv_blocks * self.pages_per_block // 8)
        # rows padded to whole query blocks: a mask_mod read past T stays in bounds
        self.bits = torch.zeros(
            kv_heads, self.q_blocks * BLOCK, width_bytes, dtype=torch.uint8, device=device
        )
        self.any = torch.zeros(
            kv_heads, self.q_blocks, self.kv_blocks, dtype=torch.bool, device=device
        )
        self.full = torch.zeros_like(self.any)
        self.shifts = torch.arange(8, dtype=torch.uint8, device=device)

    def add(self, first: int, last: int, pages: torch.Tensor) -> None:
        """Rows first..last-1 read `pages` [last - first, Hkv, n]; first % BLOCK == 0."""
        if first % BLOCK or (last % BLOCK and last != self.length):
            raise ValueError(f"chunk [{first}, {last}) is not aligned to {BLOCK}-row blocks")
        rows, _, width = pages.shape
        # bits: page p of a row is bit p % 8 of byte p // 8
        padded = _pad_last(pages, -(-width // 8) * 8)
        packed = (padded.view(rows, self.kv_heads, -1, 8).to(torch.uint8) << self.shifts).sum(
            -1, dtype=torch.uint8
        )
        self.bits[:, first:last, : packed.shape[-1]] = packed.transpose(0, 1)
        # per (row, KV block): any page read; every page read and the block wholly before t
        blocks = -(-width // self.pages_per_block)
        grouped = _pad_last(pages, blocks * self.pages_per_block).view(
            rows, self.kv_heads, blocks, self.pages_per_block
        )
        ends = (torch.arange(blocks, device=pages.device) + 1) * BLOCK
        position = torch.arange(first, last, device=pages.device).view(rows, 1, 1)
        whole = grouped.all(-1) & (ends <= position + 1) & (ends <= self.length)
        read = grouped.any(-1)
        # per query block: any row reads the block / every row reads it whole
        q_blocks = -(-rows // BLOCK)
        spare = q_blocks * BLOCK - rows
        read = torch.cat([read, read.new_zeros(spare, *read.shape[1:])])
        whole = torch.cat([whole, whole.new_ones(spare, *whole.shape[1:])])
        block_rows = slice(first // BLOCK, first // BLOCK + q_blocks)
        shape = (q_blocks, BLOCK, self.kv_heads, blocks)
        self.any[:, block_rows, :blocks] = read.view(shape).any(1).transpose(0, 1)
        self.full[:, block_rows, :blocks] = whole.view(shape).all(1).transpose(0, 1)

    def block_mask(self, group: int) -> BlockMask:
        """FlexAttention's BlockMask over Hq = group * Hkv heads, with the bitmap's mask_mod."""
        partial = self.any & ~self.full

        def listed(blocks):
            count = blocks.sum(-1, dtype=torch.int32)
            order = torch.argsort((~blocks).to(torch.uint8), dim=-1, stable=True)
            return (
                count.repeat_interleave(group, 0)[None].contiguous(),
                order.to(torch.int32).repeat_interleave(group, 0)[None].contiguous(),
            )

        return BlockMask.from_kv_blocks(
            *listed(partial),
            *listed(self.full),
            BLOCK_SIZE=(BLOCK, BLOCK),
            mask_mod=page_mask_mod(self.bits, group, self.page_size),
            seq_lengths=(self.length, self.length),
        )


def page_mask_mod(bits: torch.Tensor, group: int, page_size: int):
    """mask_mod: query head h at position q_idx reads key kv_idx when kv_idx <= q_idx and the
    bit of kv_idx's page is set for h's KV head."""

    def mask_mod(batch, head, q_idx, kv_idx):
        page = kv_idx // page_size
        byte = bits[head // group, q_idx, page // 8].to(torch.int32)
        return (((byte >> (page % 8)) & 1) == 1) & (q_idx >= kv_idx)

    return mask_mod


def _flex(cuda: bool):
    if not cuda:
        return flex_attention
    if "cuda" not in _COMPILED:
        _COMPILED["cuda"] = torch.compile(flex_attention)
    return _COMPILED["cuda"]


def _pad_last(pages: torch.Tensor, width: int) -> torch.Tensor:
    if pages.shape[-1] == width:
        return pages.contiguous()
    out = pages.new_zeros(*pages.shape[:-1], width)
    out[..., : pages.shape[-1]] = pages
    return out


def _check(q, k, v, page_size):
    if not HAS_FLEX:
        raise RuntimeError("FlexAttention is not in this torch (torch.nn.attention.flex_attention)")
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q must be [T, Hq, D] and k, v [T, Hkv, D], got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not split into {k.shape[1]} KV heads")
    if BLOCK % page_size:
        raise ValueError(f"page_size {page_size} must divide the {BLOCK}-token block")
