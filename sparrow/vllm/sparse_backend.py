"""vLLM 0.23.0 attention backend with the project's block-sparse decode (imports vllm).

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)   # plugin.py, when asked
    LLM(..., attention_config={"backend": "CUSTOM"}, block_size=16)
    set_worker_schedule(worker, schedule)    # worker_extension.py, through collective_rpc

SparseAttentionBackend is vLLM's FLASH_ATTN backend (same KV cache layout, same prefill) with
its decode replaced: the metadata builder asks vLLM to put decode requests first
(reorder_batch_threshold 1), splits the batch (sparse_decode.split_batch), lists the pages
this step fills (filled_pages, once per step for every layer) and builds FLASH_ATTN metadata
for the prefill rows only. The impl, per layer: after vLLM's own KV write
(do_kv_cache_update, unchanged), the centroids of the filled pages (kept beside vLLM's blocks
in a [num_blocks, Hkv, D] tensor of the cache dtype, the native engine's default), then
FlashAttention over the prefill rows and the project's Triton decode kernels over the decode
rows: block-sparse in the schedule's sparse layers, dense (the native dense kernel) in
skip_layers or with no schedule. sparse_decode.py holds every step of this that does not need
vllm; tests/vllm/test_sparse_decode.py holds it to the native engine on CPU.

What is refused or left out: attention other than plain causal decoder attention with scale
1/sqrt(head_dim) (no ALiBi, sliding window, soft cap, sinks), quantized KV caches, block sizes
other than the schedule's page size, speculative decoding, decode context parallelism; full
CUDA graphs (the builder reports AttentionCGSupport.NEVER: vLLM keeps its piecewise graphs
and runs attention eagerly). The centroids are not in vLLM's KV memory budget (1/(2 *
block_size) of it; engine.py leaves room) and stay allocated through vLLM's sleep mode.
vLLM's V2 model runner (its default for Qwen3 and Llama) passes no is_prefilling: a one-token
prompt chunk then decodes sparsely, so engine.py runs the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
)

from sparrow.sparse.schedule import Schedule
from sparrow.vllm.sparse_decode import (
    decode_attention,
    filled_pages,
    layer_sparsity,
    split_batch,
    update_centroids,
)

BACKEND = "sparrow.vllm.sparse_backend.SparseAttentionBackend"
BLOCK_SIZE = 16  # the native page size: a vLLM block is a sparse page


class SparseAttentionBackend(FlashAttentionBackend):
    forward_includes_kv_cache_update = False  # vLLM's KV write, then forward

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # vLLM maps the name back to AttentionBackendEnum.CUSTOM

    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        return [BLOCK_SIZE]

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype) -> bool:
        return kv_cache_dtype in (None, "auto", "float16", "bfloat16")

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type[SparseAttentionImpl]:
        return SparseAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[SparseMetadataBuilder]:
        return SparseMetadataBuilder


@dataclass
class SparseMetadata:
    """One step's attention metadata: FLASH_ATTN's for the whole batch when it holds no
    decode row (`full`), else its decode rows [0, num_decodes) as page tables and token
    counts and FLASH_ATTN's for the prefill rows after them (`prefill`, None without any);
    filled_pages: physical blocks this step completes (their centroids are due)."""

    num_decodes: int
    num_prefill_tokens: int
    full: FlashAttentionMetadata | None
    prefill: FlashAttentionMetadata | None
    decode_block_table: torch.Tensor
    decode_seq_lens: torch.Tensor
    filled_pages: torch.Tensor


class SparseMetadataBuilder(FlashAttentionMetadataBuilder):
    _cudagraph_support = AttentionCGSupport.NEVER
    supports_update_block_table = False

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        if vllm_config.speculative_config is not None:
            raise ValueError("the sparse attention backend does not take speculative decoding")
        if kv_cache_spec.block_size != BLOCK_SIZE:
            raise ValueError(
                f"the sparse attention backend needs block_size {BLOCK_SIZE} (the "
                f"sparse page), got {kv_cache_spec.block_size}"
            )
        self._init_reorder_batch_threshold(1)  # decode rows first

    def use_cascade_attention(self, *args, **kwargs) -> bool:
        return False

    def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False):
        common = common_attn_metadata
        reqs = common.num_reqs
        starts = common.query_start_loc_cpu[: reqs + 1]
        prefilling = None if common.is_prefilling is None else common.is_prefilling[:reqs].cpu()
        split = split_batch(starts, prefilling)
        seq_lens_cpu = common.seq_lens_cpu_upper_bound
        if seq_lens_cpu is None:
            seq_lens_cpu = common.seq_lens[:reqs].cpu()
        rows, pages = filled_pages(starts, seq_lens_cpu[:reqs], BLOCK_SIZE)
        table = common.block_table_tensor
        filled = table[rows.to(table.device), pages.to(table.device)]
        decodes = split.num_decodes
        full = prefill = None
        if decodes == 0:
            full = super().build(0, common, fast_build)
        elif split.num_prefill_tokens:
            prefill = super().build(
                0, prefill_rows(common, decodes, split.num_prefill_tokens), fast_build
            )
        return SparseMetadata(
            decodes,
            split.num_prefill_tokens,
            full,
            prefill,
            table[:decodes],
            common.seq_lens[:decodes],
            filled,
        )


def prefill_rows(common, decodes: int, tokens: int):
    """CommonAttentionMetadata of the rows after the first `decodes` (one token each)."""
    reqs = common.num_reqs
    cut = lambda t: None if t is None else t[decodes:reqs]  # noqa: E731
    return common.replace(
        query_start_loc=common.query_start_loc[decodes : reqs + 1] - decodes,
        query_start_loc_cpu=common.query_start_loc_cpu[decodes : reqs + 1] - decodes,
        seq_lens=common.seq_lens[decodes:reqs],
        num_reqs=reqs - decodes,
        num_actual_tokens=tokens,
        block_table_tensor=common.block_table_tensor[decodes:reqs],
        slot_mapping=common.slot_mapping[decodes : decodes + tokens],
        seq_lens_cpu_upper_bound=cut(common.seq_lens_cpu_upper_bound),
        is_prefilling=cut(common.is_prefilling),
        _seq_lens_cpu=cut(common._seq_lens_cpu),
        _num_computed_tokens_cpu=cut(common._num_computed_tokens_cpu),
        _num_computed_tokens_cache=None,
        positions=None
        if common.positions is None
        else common.positions[decodes : decodes + tokens],
    )


class SparseAttentionImpl(FlashAttentionImpl):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        unsupported = [
            name
            for name, off in (
                ("ALiBi", self.alibi_slopes is None),
                ("a sliding window", self.sliding_window == (-1, -1)),
                ("a logits soft cap", not self.logits_soft_cap),
                ("sinks", self.sinks is None),
                ("a quantized KV cache", self.kv_cache_dtype in ("auto", "float16", "bfloat16")),
                (
                    "a scale other than 1/sqrt(head_dim)",
                    abs(self.scale * self.head_size**0.5 - 1.0) < 1e-6,
                ),
            )
            if not off
        ]
        if unsupported:
            raise ValueError(f"the sparse attention backend does not take {', '.join(unsupported)}")
        self.schedule: Schedule | None = None
        self.layer_index = -1
        self.sparsity = None
        self.centroids: torch.Tensor | None = None

    def set_schedule(
        self, schedule: Schedule | None, layer_index: int, device: torch.device
    ) -> None:
        """This layer's decode from now on: sparse under `schedule` unless among its
        skip_layers; None decodes densely (centroids are kept up to date either way)."""
        if schedule is not None and schedule.page_size != BLOCK_SIZE:
            raise ValueError(
                f"schedule {schedule.name!r} has page_size {schedule.page_size}; "
                f"vLLM's blocks hold {BLOCK_SIZE} tokens"
            )
        self.schedule, self.layer_index = schedule, layer_index
        self.sparsity = layer_sparsity(schedule, layer_index, device)

    def _centroids(self, kv_cache: torch.Tensor) -> torch.Tensor:
        blocks, _, _, kv_heads, dim = kv_cache.shape
        if (
            self.centroids is None
            or self.centroids.shape[0] != blocks
            or self.centroids.device != kv_cache.device
        ):
            # a (re)allocated cache: no page holds keys of an earlier one
            self.centroids = torch.zeros(
                blocks, kv_heads, dim, dtype=kv_cache.dtype, device=kv_cache.device
            )
        return self.centroids

    def forward(
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output,
        output_scale=None,
        output_block_scale=None,
    ):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("the sparse attention backend fuses no output quantization")
        if attn_metadata is None or kv_cache.numel() == 0:  # profiling run
            return output.fill_(0)
        key_cache, value_cache = kv_cache.unbind(1)
        centroids = self._centroids(kv_cache)
        update_centroids(key_cache, centroids, attn_metadata.filled_pages)
        meta: SparseMetadata = attn_metadata
        if meta.full is not None:  # no decode row: FLASH_ATTN as it is
            return super().forward(layer, query, key, value, kv_cache, meta.full, output)
        decodes = meta.num_decodes
        if meta.prefill is not None:
            end = decodes + meta.num_prefill_tokens
            super().forward(
                layer,
                query[decodes:end],
                key[decodes:end],
                value[decodes:end],
                kv_cache,
                meta.prefill,
                output[decodes:end],
            )
        output[:decodes] = decode_attention(
            query[:decodes],
            key_cache,
            value_cache,
            centroids,
            meta.decode_block_table,
            meta.decode_seq_lens,
            self.sparsity,
        )
        return output


def set_worker_schedule(worker: Any, schedule: Schedule | None) -> int:
    """Give every sparse-backend attention layer of a vLLM worker `schedule` (None: dense
    decode); returns how many layers took it (0: the backend is not in use)."""
    from vllm.model_executor.models.utils import extract_layer_index

    runner = worker.model_runner
    layers = runner.vllm_config.compilation_config.static_forward_context
    taken = 0
    for name, module in layers.items():
        impl = getattr(module, "impl", None)
        if isinstance(impl, SparseAttentionImpl):
            impl.set_schedule(schedule, extract_layer_index(name), runner.device)
            taken += 1
    return taken
