"""ModelRunner: turns a batch of sequences into one forward pass and last-token logits.

    runner = ModelRunner(model, cache, block_manager)
    logits = runner.prefill(seqs)                          # [len(seqs), vocab] float32
    logits = runner.decode(seqs, schedule, on_selection)   # one new token per sequence

Prefill packs the sequences' tokens end to end (dense causal attention within each);
decode feeds each sequence's last token at position num_tokens - 1 and reads the paged
cache (dense, or block-sparse when a schedule is given). The runner builds flat tensors and
an explicit StepMetadata per step; decode inputs have fixed shapes given the batch size and
page-table width, which is where CUDA-graph capture per batch-size bucket plugs in (pad the
batch to the bucket, capture `model(...)` with a PagedAttention over static buffers).
"""

from __future__ import annotations

import torch

from sparrow_core.engine.block_manager import BlockManager
from sparrow_core.engine.kv_cache import KVCache
from sparrow_core.engine.sequence import Sequence
from sparrow_core.engine.step_attention import PagedAttention, SelectionHook, StepMetadata
from sparrow_core.sparse.schedule import Schedule


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: KVCache, block_manager: BlockManager):
        self.model = model
        self.cache = cache
        self.block_manager = block_manager
        self.device = cache.k.device

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Run every token of each (page-holding) sequence; logits of each last token."""
        page_size = self.block_manager.page_size
        ids, positions, slots, filled, lens = [], [], [], [], []
        for seq in seqs:
            n = seq.num_tokens
            ids.extend(seq.token_ids)
            positions.extend(range(n))
            slots.extend(self.block_manager.slot(seq, p) for p in range(n))
            filled.extend(seq.page_table[: n // page_size])
            lens.append(n)
        meta = StepMetadata(self._tensor(slots), self._tensor(filled), prefill_lens=tuple(lens))
        hidden = self.model(self._tensor(ids), self._tensor(positions),
                            PagedAttention(self.cache, meta, None))
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], schedule: Schedule | None,
               on_selection: SelectionHook | None = None) -> torch.Tensor:
        """One step for each sequence: its last token attends to its cached tokens."""
        page_size = self.block_manager.page_size
        width = max(len(seq.page_table) for seq in seqs)
        ids, positions, slots, filled, tables, topk = [], [], [], [], [], []
        for seq in seqs:
            position = seq.num_tokens - 1
            ids.append(seq.token_ids[-1])
            positions.append(position)
            slots.append(self.block_manager.slot(seq, position))
            if (position + 1) % page_size == 0:
                filled.append(seq.page_table[position // page_size])
            # padding entries point at page 0; the token count masks them out
            tables.append(seq.page_table + [0] * (width - len(seq.page_table)))
            if schedule is not None:
                topk.append(schedule.topk_for_position(position))
        meta = StepMetadata(
            self._tensor(slots), self._tensor(filled),
            page_tables=self._tensor(tables),
            num_tokens=self._tensor(positions) + 1,
            topk=self._tensor(topk) if schedule is not None else None,
        )
        hidden = self.model(self._tensor(ids), self._tensor(positions),
                            PagedAttention(self.cache, meta, schedule, on_selection))
        return self.model.compute_logits(hidden)
