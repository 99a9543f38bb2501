"""ModelRunner: turns a batch of sequences into one forward pass and last-token logits.

    runner = ModelRunner(model, cache, block_manager, options)   # options: KernelOptions
    logits = runner.prefill(seqs)                          # [len(seqs), vocab] float32
    logits = runner.decode(seqs, schedule, on_selection)   # one new token per sequence
    logits = runner.decode(seqs, schedule, pending_ids=ids)  # the step after one in flight
    outputs = StepOutputs(sample_output); ids, logprobs, topk_ids, topk_logprobs = outputs.read()

Prefill packs the sequences' tokens end to end (dense causal attention within each);
decode feeds each sequence's last token at position num_tokens - 1 and reads the paged
cache (dense, or block-sparse when a schedule is given). With pending_ids (the device tensor
of tokens sampled by a step still in flight, not yet appended on the host) each sequence
decodes the next position, num_tokens, with that token as input: no host round trip. The runner builds flat tensors and
an explicit StepMetadata per step. On CUDA (with triton) decode goes through
engine/cuda_graphs.py instead: Triton kernels and one CUDA graph per batch-size bucket,
fed from numpy arrays (each sequence's page table is kept as an array and only grows);
a selection hook (record_selection) keeps the eager PagedAttention path. StepOutputs moves a
step's sampled outputs to the host in one packed copy (on CUDA: non_blocking into pinned
memory, then an event), so the host can do other work until it reads them. Every forward
pass, and so every kernel launch and CUDA-graph capture, runs under the runner's
KernelOptions (EngineConfig.kernel_options()).
"""

from __future__ import annotations

import numpy as np
import torch

from sparrow.engine.block_manager import BlockManager
from sparrow.engine.cuda_graphs import DecodeGraphs
from sparrow.engine.kv_cache import KVCache
from sparrow.engine.sampler import SampleOutput
from sparrow.engine.sequence import Sequence
from sparrow.engine.step_attention import PagedAttention, SelectionHook, StepMetadata
from sparrow.kernels.runtime import HAS_TRITON, KernelOptions, kernel_options
from sparrow.sparse.schedule import Schedule
from sparrow.token_arrays import TOPK_ID_DTYPE, TOPK_LOGPROB_DTYPE


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        cache: KVCache,
        block_manager: BlockManager,
        options: KernelOptions | None = None,
        graphs: DecodeGraphs | None = None,
    ):
        self.model = model
        self.cache = cache
        self.block_manager = block_manager
        self.options = options or KernelOptions()
        self.device = cache.k.device
        self.graphs = graphs  # an earlier runner's, attached to this cache by the engine
        if graphs is None and self.device.type == "cuda" and HAS_TRITON:
            self.graphs = DecodeGraphs(model, cache)
        # seq_id -> its page table as an array (rows only grow while a sequence decodes)
        self._tables: dict[int, np.ndarray] = {}

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
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        with kernel_options(self.options):
            hidden = self.model(
                self._tensor(ids), self._tensor(positions), PagedAttention(self.cache, meta, None)
            )
            return self.model.compute_logits(hidden[last])

    @torch.inference_mode()
    def decode(
        self,
        seqs: list[Sequence],
        schedule: Schedule | None,
        on_selection: SelectionHook | None = None,
        pending_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step for each sequence: its last token attends to its cached tokens.
        pending_ids [B] (device): the in-flight step's tokens, input at position num_tokens."""
        with kernel_options(self.options):
            if self.graphs is not None and on_selection is None:
                return self._decode_graphed(seqs, schedule, pending_ids)
            return self._decode_eager(seqs, schedule, on_selection, pending_ids)

    def _decode_eager(
        self,
        seqs: list[Sequence],
        schedule: Schedule | None,
        on_selection: SelectionHook | None,
        pending_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """decode() through PagedAttention (the CPU path, and a selection hook's)."""
        ahead = 0 if pending_ids is None else 1
        page_size = self.block_manager.page_size
        width = max(len(seq.page_table) for seq in seqs)
        ids, positions, slots, filled, tables, topk = [], [], [], [], [], []
        for seq in seqs:
            position = seq.num_tokens - 1 + ahead
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
            self._tensor(slots),
            self._tensor(filled),
            page_tables=self._tensor(tables),
            num_tokens=self._tensor(positions) + 1,
            topk=self._tensor(topk) if schedule is not None else None,
        )
        input_ids = self._tensor(ids) if pending_ids is None else pending_ids
        hidden = self.model(
            input_ids,
            self._tensor(positions),
            PagedAttention(self.cache, meta, schedule, on_selection),
        )
        return self.model.compute_logits(hidden)

    def _table(self, seq: Sequence) -> np.ndarray:
        table = self._tables.get(seq.seq_id)
        if table is None or len(table) != len(seq.page_table) or table[-1] != seq.page_table[-1]:
            table = np.asarray(seq.page_table, dtype=np.int32)
            self._tables[seq.seq_id] = table
        return table

    def _decode_graphed(
        self, seqs: list[Sequence], schedule: Schedule | None, pending_ids: torch.Tensor | None
    ) -> torch.Tensor:
        batch = len(seqs)
        last = 0 if pending_ids is None else 1  # the input's offset from the last known token
        positions = np.fromiter(
            (s.num_tokens - 1 + last for s in seqs), dtype=np.int64, count=batch
        )
        ids = pending_ids
        if ids is None:
            ids = np.fromiter((s.token_ids[-1] for s in seqs), dtype=np.int64, count=batch)
        width = max(len(s.page_table) for s in seqs)
        # padding entries point at page 0; the token count masks them out
        tables = np.zeros((batch, width), dtype=np.int32)
        for row, seq in enumerate(seqs):
            table = self._table(seq)
            tables[row, : len(table)] = table
        page_size = self.block_manager.page_size
        slots = tables[np.arange(batch), positions // page_size] * page_size + positions % page_size
        topk = None
        if schedule is not None:
            topk = np.fromiter(
                (schedule.topk_for_position(int(p)) for p in positions), dtype=np.int64, count=batch
            )
        live = {s.seq_id for s in seqs}
        for seq_id in [i for i in self._tables if i not in live]:
            del self._tables[seq_id]
        return self.graphs.decode(ids, positions, slots, tables, topk, schedule)


class StepOutputs:
    """A step's sampled outputs on their way to the host, as one packed float64 copy (ids and
    logprobs are exact in it); read() waits for the copy and returns the rows."""

    def __init__(self, out: SampleOutput):
        self.width = out.topk_ids.shape[1]
        packed = torch.cat(
            [
                out.token_ids[:, None].double(),
                out.logprobs[:, None].double(),
                out.topk_ids.double(),
                out.topk_logprobs.double(),
            ],
            dim=1,
        )
        self._event = None
        if packed.is_cuda:
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = packed

    def read(self) -> tuple[list[int], list[float], np.ndarray, np.ndarray]:
        """(token ids, logprobs) per row as Python lists; the top-K ids and logprobs as
        [rows, K] int32 / float32 arrays (a sample keeps a view of its row)."""
        if self._event is not None:
            self._event.synchronize()
        rows = self._host.numpy()
        k = self.width
        return (
            rows[:, 0].astype(np.int64).tolist(),
            rows[:, 1].tolist(),
            rows[:, 2 : 2 + k].astype(TOPK_ID_DTYPE),
            rows[:, 2 + k :].astype(TOPK_LOGPROB_DTYPE),
        )
