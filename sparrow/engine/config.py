"""EngineConfig: the rollout engine's knobs, a frozen dataclass that checks itself.

    config = EngineConfig(max_batch_size=8, page_size=16, kv_cache_mib=64)
    config = EngineConfig(num_pages=40, page_size=4)      # tests: an exact page count
    config = EngineConfig(centroid_dtype="float8_e4m3fn") # page centroids in 8-bit float
    config = EngineConfig(programmatic_launch="none")     # GPU kernels: compare a choice
    config = EngineConfig.from_rollout(cfg.rollout, page_size=schedule.page_size,
                                       max_context=cfg.model.max_context)

The KV page is the sparse page, so `page_size` must equal the schedule's page size.
programmatic_launch, skinny_linear and fold_norms choose among GPU kernels (the defaults are
the measured best; kernels/runtime.py KernelOptions); the engine runs every forward pass
under them, and off GPU they change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparrow.errors import SparrowError
from sparrow.kernels.runtime import KernelOptions, pdl_families

# the values of EngineConfig.centroid_dtype
CENTROID_DTYPES = ("cache", "float8_e4m3fn")
# the values of EngineConfig.programmatic_launch: every kernel family, none, or one family
PROGRAMMATIC_LAUNCH = ("all", "none", "linear", "attention")


class EngineError(SparrowError, ValueError):
    """A bad engine setting or a request the engine cannot serve; the message has the numbers."""


@dataclass(frozen=True)
class EngineConfig:
    # most sequences decoded at once (slots); more requests wait for a slot
    max_batch_size: int = 64
    # tokens per KV page; the page is also the unit of block-sparse selection
    page_size: int = 16
    # KV cache memory (keys, values and page centroids of every layer) in MiB
    kv_cache_mib: float = 256.0
    # exact number of KV pages; 0 sizes the cache from memory_utilization or kv_cache_mib
    num_pages: int = 0
    # on CUDA: size the cache when it is allocated (at start and at each wake()) so the
    # device's used memory, all processes counted, reaches this share of its total (98% of
    # that, kept from wake to wake while it fits: kv_cache.pages_for_room); 0 uses kv_cache_mib
    memory_utilization: float = 0.0
    # longest total sequence (prompt + new tokens); 0 takes the model's max_position_embeddings
    max_context: int = 0
    # most prompt tokens prefilled in one forward pass (a longer prompt still runs, alone)
    max_prefill_tokens: int = 8192
    # base seed for requests whose SamplingParams.seed is None
    seed: int = 0
    # true keeps generating past the model's eos tokens (stop_token_ids still stop)
    ignore_eos: bool = False
    # debug: record, per decode step, layer and sequence, the selected page ids (tests);
    # recording keeps every step synchronous
    record_selection: bool = False
    # launch decode step t+1 from step t's device-side tokens and do step t's host work while
    # it runs (steady decode only; results equal the synchronous loop's)
    overlap: bool = True
    # page centroids' dtype: "cache" (the KV cache's) or "float8_e4m3fn" (half the bytes page
    # scoring reads; selection changes slightly: calibrate with the same setting)
    centroid_dtype: str = "cache"
    # GPU kernels launched with programmatic dependent launch (compute capability 9.0 and
    # later): all, none, linear (decode projections) or attention (q/k norm + RoPE, page
    # scoring, top-k, attention, split combine)
    programmatic_launch: str = "all"
    # decode projections of up to 16 rows in the weight-streaming kernel (false: cuBLAS)
    skinny_linear: bool = True
    # a decode layer's RMSNorms and residual adds folded into its projections' kernels
    # (false: in the norm kernel)
    fold_norms: bool = True
    # keep the decode CUDA graphs while asleep and replay them after waking when the new KV
    # cache lies where the old one did (false: free them with the cache, capture again)
    keep_graphs: bool = True

    def __post_init__(self) -> None:
        for key in ("max_batch_size", "page_size", "max_prefill_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineError(f"EngineConfig.{key} must be a positive integer, got {value!r}")
        if self.page_size & (self.page_size - 1):
            raise EngineError(
                f"EngineConfig.page_size must be a power of two, got {self.page_size}"
            )
        for key in ("num_pages", "max_context"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EngineError(f"EngineConfig.{key} must be an integer >= 0, got {value!r}")
        for key in (
            "ignore_eos",
            "record_selection",
            "overlap",
            "skinny_linear",
            "fold_norms",
            "keep_graphs",
        ):
            if not isinstance(getattr(self, key), bool):
                raise EngineError(
                    f"EngineConfig.{key} must be true or false, got {getattr(self, key)!r}"
                )
        if self.centroid_dtype not in CENTROID_DTYPES:
            raise EngineError(
                f"EngineConfig.centroid_dtype must be one of "
                f"{', '.join(CENTROID_DTYPES)}, got {self.centroid_dtype!r}"
            )
        if self.programmatic_launch not in PROGRAMMATIC_LAUNCH:
            raise EngineError(
                f"EngineConfig.programmatic_launch must be one of "
                f"{', '.join(PROGRAMMATIC_LAUNCH)}, got "
                f"{self.programmatic_launch!r}"
            )
        if not 0 <= self.memory_utilization < 1:
            raise EngineError(
                f"EngineConfig.memory_utilization must be in [0, 1), got "
                f"{self.memory_utilization!r}"
            )
        if not self.kv_cache_mib > 0:
            raise EngineError(
                f"EngineConfig.kv_cache_mib must be positive, got {self.kv_cache_mib}"
            )

    def kernel_options(self) -> KernelOptions:
        """The kernel choices the engine's forward passes run under."""
        return KernelOptions(
            programmatic_launch=pdl_families(self.programmatic_launch),
            skinny_linear=self.skinny_linear,
            fold_norms=self.fold_norms,
        )

    @classmethod
    def from_rollout(
        cls, rollout: Any, page_size: int = 16, max_context: int = 0, **overrides: Any
    ) -> EngineConfig:
        """From the typed `rollout` config group (kv_cache_mib, gpu_memory_utilization,
        max_batch_size, seed, overlap, centroid_dtype, ignore_eos, programmatic_launch,
        skinny_linear, fold_norms, keep_graphs)."""
        values = dict(
            max_batch_size=rollout.max_batch_size,
            kv_cache_mib=float(rollout.kv_cache_mib),
            seed=rollout.seed,
            overlap=rollout.overlap,
            centroid_dtype=rollout.centroid_dtype,
            page_size=page_size,
            max_context=max_context,
            memory_utilization=float(rollout.gpu_memory_utilization),
            ignore_eos=bool(rollout.ignore_eos),
            programmatic_launch=rollout.programmatic_launch,
            skinny_linear=bool(rollout.skinny_linear),
            fold_norms=bool(rollout.fold_norms),
            keep_graphs=bool(rollout.keep_graphs),
        )
        values.update(overrides)
        return cls(**values)
