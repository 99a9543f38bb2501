"""Teacher-forced forward: logits at every position of given sequences, sparse or dense.

    logits = teacher_forced_logits(model, [ids_a, ids_b], prompt_lens=[5, 9], schedule=s)
    logits[0][t]   # [vocab] float32: what decoding ids_a one token at a time gives at t
    logits = teacher_forced_logits(..., centroid_dtype="float8_e4m3fn")  # the engine's setting

Prompt positions attend densely (as prefill). Every later position t (its token was
generated) attends as the decode step that fed it did: the cache then held t + 1 tokens,
n = t // page_size + 1 pages; the centroids of the pages full by then (a page's centroid is
fixed once it fills, so it is computed once from the sequence's keys, rounded to the
engine's centroid dtype, EngineConfig.centroid_dtype, as its KVCache stores them); its own
q_mean;
top-k from the schedule at position t; reserved_bos and reserved_eos pages always read;
layers in skip_layers dense. With schedule=None every position is dense causal (the dense
variant, equal to transformers' forward). No cache writes: gradients flow to q, k, v
(DistillSparse); the page selection itself is discrete and computed without grad, chunk by
chunk of positions (engine/teacher_selection.py). Three attention paths over those pages:
on CUDA tensors, the Triton kernels (engine/teacher_kernel.py: selection packed into bits, a
flash-attention forward that reads them, one launch per layer, and its flash-attention-2
backward, kernels/teacher_attention_backward.py, when gradients are recorded); FlexAttention
over a page
bitmap (engine/teacher_flex.py: a compiled Triton kernel that skips unread 128-token blocks,
forward and backward; SDPA for dense layers and sequences), taken on CUDA when triton is
missing or the page size is not a power of two, or when asked; elsewhere the float32 masked
reference, queries in chunks of `query_chunk` so memory is [Hq, chunk, T] per sequence and
layer. backend="triton" / "flex" / "reference" forces one.
Run `python -m pytest tests/engine/teacher/test_forced.py -q`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from sparrow.engine.attention import masked_attention
from sparrow.engine.kv_cache import centroid_torch_dtype
from sparrow.engine.teacher.flex import HAS_FLEX, selection_rows, sparse_flex_attention
from sparrow.engine.teacher.kernel import PackedIndex, kernel_sparse_attention
from sparrow.engine.teacher.selection import gather_pages, select_chunks
from sparrow.kernels.prefill import prefill_attention_sdpa
from sparrow.kernels.runtime import HAS_TRITON
from sparrow.kernels.teacher_attention import supported_page_size
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.selection import token_mask

# called with (layer, sequence index, page_mask [T, Hkv, P]) for each sparse layer (tests)
TeacherSelectionHook = Callable[[int, int, torch.Tensor], None]
# called with (layer, q [N, Hq, D], k [N, Hkv, D]) of every layer, after RoPE, before attention
# (N: the packed sequences' tokens; DistillSparse's selector term, trainer/selector_distill.py)
QueryKeyHook = Callable[[int, torch.Tensor, torch.Tensor], None]
BACKENDS = ("auto", "triton", "flex", "reference")


def teacher_forced_logits(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int] | torch.Tensor],
    prompt_lens: Sequence[int] | None = None,
    schedule: Schedule | None = None,
    query_chunk: int = 1024,
    on_selection: TeacherSelectionHook | None = None,
    centroid_dtype: str = "cache",
    backend: str = "auto",
) -> list[torch.Tensor]:
    """Float32 logits [T_i, vocab] per sequence; sparse at generated positions if scheduled;
    centroid_dtype as the decoding engine's EngineConfig.centroid_dtype; backend as
    TeacherForcedAttention's."""
    hidden = teacher_forced_hidden(
        model, sequences, prompt_lens, schedule, query_chunk, on_selection, centroid_dtype, backend
    )
    return [model.compute_logits(h) for h in hidden]


def teacher_forced_hidden(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int] | torch.Tensor],
    prompt_lens: Sequence[int] | None = None,
    schedule: Schedule | None = None,
    query_chunk: int = 1024,
    on_selection: TeacherSelectionHook | None = None,
    centroid_dtype: str = "cache",
    backend: str = "auto",
    on_qk: QueryKeyHook | None = None,
) -> list[torch.Tensor]:
    """Final hidden states [T_i, hidden] per sequence (see teacher_forced_logits); on_qk sees
    every layer's queries and keys."""
    device = next(model.parameters()).device
    ids = [torch.as_tensor(s, dtype=torch.long, device=device).flatten() for s in sequences]
    lens = [int(t.shape[0]) for t in ids]
    if prompt_lens is None:
        if schedule is not None:
            raise ValueError("a sparse teacher-forced forward needs prompt_lens")
        prompt_lens = lens
    prompt_lens = [int(p) for p in prompt_lens]
    if len(prompt_lens) != len(lens) or any(not 1 <= p <= n for p, n in zip(prompt_lens, lens)):
        raise ValueError(
            f"prompt_lens {prompt_lens} must give 1 <= prompt_len <= length for "
            f"sequences of lengths {lens}"
        )
    attention = TeacherForcedAttention(
        lens, prompt_lens, schedule, query_chunk, on_selection, centroid_dtype, backend, on_qk
    )
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    hidden = model(torch.cat(ids), positions, attention)
    return list(hidden.split(lens))


class TeacherForcedAttention:
    """AttentionFn over packed whole sequences, each query with its own page selection.

    backend: "auto" (on CUDA tensors the Triton kernels of engine/teacher_kernel.py without
    gradients, FlexAttention with gradients or when triton is missing or the page size is
    not a power of two; the reference otherwise), "triton", "flex" or "reference"; all take the
    pages of teacher_selection.select_chunks' rule."""

    def __init__(
        self,
        seq_lens: list[int],
        prompt_lens: list[int],
        schedule: Schedule | None,
        query_chunk: int = 1024,
        on_selection: TeacherSelectionHook | None = None,
        centroid_dtype: str = "cache",
        backend: str = "auto",
        on_qk: QueryKeyHook | None = None,
    ):
        if query_chunk < 1:
            raise ValueError(f"query_chunk must be positive, got {query_chunk}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        centroid_torch_dtype(centroid_dtype, torch.float32)  # refuse a bad name now
        self.centroid_dtype = centroid_dtype
        self.seq_lens = seq_lens
        self.prompt_lens = prompt_lens
        self.schedule = schedule
        self.query_chunk = query_chunk
        self.on_selection = on_selection
        self.backend = backend
        self.on_qk = on_qk
        self._index: PackedIndex | None = None  # the kernels' device tensors, made once

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if self.on_qk is not None:
            self.on_qk(layer, q, k)
        sparse = self.schedule is not None and self.schedule.is_sparse_layer(layer)
        if sparse and self._use_kernels(q, k, v):
            hook = None
            if self.on_selection is not None:
                hook = lambda index, pages: self.on_selection(layer, index, pages)  # noqa: E731
            if self._index is None or self._index.seq_lens.device != q.device:
                self._index = PackedIndex.build(self.seq_lens, self.schedule, q.device)
            return kernel_sparse_attention(
                q,
                k,
                v,
                self.seq_lens,
                self.prompt_lens,
                self.schedule,
                self.centroid_dtype,
                hook,
                self._index,
                self._dense_heads(layer),
            )
        flex = self._use_flex(q)
        outputs, start = [], 0
        for index, (length, prompt_len) in enumerate(zip(self.seq_lens, self.prompt_lens)):
            span = slice(start, start + length)
            if sparse and prompt_len < length:
                outputs.append(
                    self._sparse(layer, index, q[span], k[span], v[span], prompt_len, flex)
                )
            elif flex:
                outputs.append(prefill_attention_sdpa(q[span], k[span], v[span], [length]))
            else:
                outputs.append(self._attend(q[span], k[span], v[span], self._dense_chunks(length)))
            start += length
        return torch.cat(outputs)

    def _sparse(self, layer, index, q, k, v, prompt_len, flex):
        """One sequence on a sparse layer: its pages chunk by chunk, then attention."""
        length, page_size = q.shape[0], self.schedule.page_size
        collected: list[torch.Tensor] = []
        keep = collected.append if self.on_selection is not None else None
        rows = selection_rows(k.shape[1], length, page_size) if flex else self.query_chunk
        chunks = select_chunks(
            q, k, prompt_len, self.schedule, self.centroid_dtype, rows, self._dense_heads(layer)
        )
        if flex:
            out = sparse_flex_attention(q, k, v, chunks, page_size, keep)
        else:
            out = self._attend(q, k, v, chunks, keep)
        if keep is not None:
            self.on_selection(layer, index, gather_pages(collected, -(-length // page_size)))
        return out

    def _dense_heads(self, layer: int) -> tuple[int, ...]:
        return self.schedule.dense_heads_of(layer)

    def _use_kernels(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        if self.backend != "auto":
            return self.backend == "triton"
        # with or without gradients: the kernels' backward equals Flex's to 1e-3 (relative) on
        # an H100 and runs 1.4x faster (docs/benchmarks.md, teacher-forced backward)
        return q.is_cuda and HAS_TRITON and supported_page_size(self.schedule.page_size)

    def _use_flex(self, q: torch.Tensor) -> bool:
        if self.backend == "auto":
            return q.is_cuda and HAS_FLEX
        return self.backend == "flex"

    def _dense_chunks(self, length):
        return (
            (first, min(first + self.query_chunk, length), None)
            for first in range(0, length, self.query_chunk)
        )

    def _attend(self, q, k, v, chunks, on_pages=None):
        """Causal attention of one sequence in query chunks, restricted per query to the
        chunk's pages when given (the float32 reference)."""
        out = []
        kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        for first, last, pages in chunks:
            rows = torch.arange(first, last, device=q.device)
            mask = rows.view(-1, 1) >= torch.arange(last, device=q.device).view(1, -1)
            if pages is not None:
                if on_pages is not None:
                    on_pages(pages)
                tokens = token_mask(
                    pages,
                    self.schedule.page_size,
                    torch.full((last - first,), last, device=q.device),
                )
                mask = mask.unsqueeze(1) & tokens[..., :last]  # [Q, Hkv, K]
                mask = mask.transpose(0, 1)[None]
            keys, values = kh[:, :, :last], vh[:, :, :last]
            result = masked_attention(q[first:last].transpose(0, 1)[None], keys, values, mask)
            out.append(result[0].transpose(0, 1))
        return torch.cat(out).to(q.dtype)
