"""Teacher-forced sparse attention of a whole layer through the Triton kernels: selection
bits chunk by chunk of positions, then one attention launch over every sequence.

    out = kernel_sparse_attention(q, k, v, seq_lens, prompt_lens, schedule, "cache")
    # q [N, Hq, D], k, v [N, Hkv, D] packed sequences; out [N, Hq, D] in q's dtype

The pages are teacher_selection.select_chunks' (the decode rule at every position, prompt
positions dense): the schedule's scoring rule over what the engine's cache holds of the full
pages (teacher/selection.py chunk_scores: float32 products per chunk, the tensor cores'
work, as select_chunks does it; dense_heads set whole), then kernels/teacher_pages.py finds each row's top k and packs it
into bits [Hkv, N, words] (4 MiB per 8K-token sequence at 8 KV heads). kernels/
teacher_attention.py reads them; when q, k or v record gradients (DistillSparse), its
autograd Function (kernels/teacher_attention_backward.py) saves what the backward kernels
need. Off GPU both launchers run their PyTorch references, so
the same call works (slowly) on a laptop; TeacherForcedAttention takes it only when asked
(backend="triton") there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sparrow.engine.teacher.selection import chunk_scores, row_elements, sequence_pages
from sparrow.kernels.teacher_attention import teacher_sparse_attention
from sparrow.kernels.teacher_attention_backward import teacher_sparse_attention_trainable
from sparrow.kernels.teacher_pages import WORD, select_page_bits, unpack_page_bits
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.scoring import get_rule

# scores of one selection chunk: [rows, Hkv, pages] float32 of about this many elements
SCORE_BUDGET = 1 << 26  # 256 MiB


@dataclasses.dataclass(frozen=True)
class PackedIndex:
    """The device tensors every layer of one replay shares (built once: each is a host to
    device copy, which would make the host wait for the GPU at every layer)."""

    seq_starts: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32
    topk_of_bin: torch.Tensor  # [bins] the schedule's k per length bin

    @classmethod
    def build(cls, seq_lens: list[int], schedule: Schedule, device: torch.device):
        starts = [sum(seq_lens[:i]) for i in range(len(seq_lens))]
        as_int32 = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
        return cls(
            as_int32(starts), as_int32(seq_lens), torch.tensor(schedule.topk_pages, device=device)
        )


def selection_bits(
    q: torch.Tensor,
    k: torch.Tensor,
    seq_lens: list[int],
    prompt_lens: list[int],
    schedule: Schedule,
    centroid_dtype: str,
    budget: int = SCORE_BUDGET,
    topk_of_bin: torch.Tensor | None = None,
    dense_heads: tuple[int, ...] = (),
) -> torch.Tensor:
    """Bits [Hkv, N, words] int32 of every position of the packed sequences; topk_of_bin:
    PackedIndex's, when the caller holds one; dense_heads: KV heads reading every page."""
    q, k = q.detach(), k.detach()  # the selection is discrete: no graph through it
    kv_heads = k.shape[1]
    size = schedule.page_size
    rule = get_rule(schedule.selection)
    pages = -(-max(seq_lens) // size)
    words = -(-pages // WORD)
    bits = torch.empty(kv_heads, q.shape[0], words, dtype=torch.int32, device=q.device)
    if topk_of_bin is None:
        topk_of_bin = torch.tensor(schedule.topk_pages, device=q.device)
    start = 0
    for length, prompt_len in zip(seq_lens, prompt_lens):
        seq_q, seq_k = q[start : start + length], k[start : start + length]
        pages = sequence_pages(seq_k, size, centroid_dtype, rule) if prompt_len < length else None
        width = -(-length // size)
        rows = max(1, budget // max(1, row_elements(rule, q.shape[1], kv_heads, length, width)))
        for first in range(0, length, rows):
            last = min(first + rows, length)
            position = torch.arange(first, last, device=q.device)
            topk = topk_of_bin[schedule.bin_of(position)]
            out = bits[:, start + first : start + last]
            if last <= prompt_len:
                select_page_bits(
                    None,
                    first,
                    prompt_len,
                    topk,
                    size,
                    schedule.reserved_bos,
                    schedule.reserved_eos,
                    words,
                    out=out,
                    kv_heads=kv_heads,
                )
                continue
            # the product select_chunks computes, so both paths rank the same floats
            scores = chunk_scores(rule, seq_q, pages, first, last, size)
            if scores.stride(-1) != 1:  # einsum may hand back a permuted layout
                scores = scores.contiguous()
            select_page_bits(
                scores,
                first,
                prompt_len,
                topk,
                size,
                schedule.reserved_bos,
                schedule.reserved_eos,
                words,
                out=out,
            )
            for head in dense_heads:  # every present page, as a prompt row reads them
                select_page_bits(
                    None,
                    first,
                    last,
                    topk,
                    size,
                    schedule.reserved_bos,
                    schedule.reserved_eos,
                    words,
                    out=out[head : head + 1],
                    kv_heads=1,
                )
        start += length
    return bits


def kernel_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    prompt_lens: list[int],
    schedule: Schedule,
    centroid_dtype: str,
    on_pages: Callable[[int, torch.Tensor], None] | None = None,
    index: PackedIndex | None = None,
    dense_heads: tuple[int, ...] = (),
) -> torch.Tensor:
    """Attention of a sparse layer over packed sequences (see the module docstring);
    on_pages(sequence index, page mask [T, Hkv, P]) for each sequence, if given (tests);
    index: the replay's PackedIndex (built here when None)."""
    if index is None:
        index = PackedIndex.build(seq_lens, schedule, q.device)
    bits = selection_bits(
        q,
        k,
        seq_lens,
        prompt_lens,
        schedule,
        centroid_dtype,
        topk_of_bin=index.topk_of_bin,
        dense_heads=dense_heads,
    )
    if on_pages is not None:
        start = 0
        for number, (length, prompt_len) in enumerate(zip(seq_lens, prompt_lens)):
            # as the reference path: a sequence with no generated position selects nothing
            if prompt_len < length:
                pages = -(-length // schedule.page_size)
                on_pages(number, unpack_page_bits(bits[:, start : start + length], pages))
            start += length
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    attend = teacher_sparse_attention_trainable if recording else teacher_sparse_attention
    return attend(
        q,
        k.to(q.dtype),
        v.to(q.dtype),
        bits,
        index.seq_starts,
        index.seq_lens,
        schedule.page_size,
        max_len=max(seq_lens),
    )
