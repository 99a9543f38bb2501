"""VllmEngine: vLLM 0.23.0's LLM behind the native Engine's calls (dense decode, one GPU).

    engine = VllmEngine(weights_path, EngineConfig(max_batch_size=64), tokenizer=tokenizer)
    results = engine.generate(prompt_ids, [SamplingParams(...), ...])  # [prompt][sample]
    engine.update_weights(state_dict)   # transformers names, in place; prefix cache reset
    engine.sleep(); engine.wake()       # vLLM sleep mode level 1 between rollout and training
    engine.set_schedule(schedule)       # sparse only when started with a sparse schedule

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the "uni" executor), so the
trainer's tensors reach its model without a copy through a socket: update_weights calls the
worker extension (worker_extension.py) by name through LLM.collective_rpc. Requests go as token
ids (no vLLM tokenizer: skip_tokenizer_init) with one vLLM request per sample and the
sample's seed (outputs.py); text is decoded with the project's tokenizer as the native engine
does. The KV cache is sized once, at start: by EngineConfig.memory_utilization when set (the
share of the device's total that its used memory may reach, as for the native engine; vLLM's
gpu_memory_utilization is this instance's own share, so the engine passes the target less what
other processes, a colocated trainer, hold at that moment), else kv_cache_mib
(kv_cache_memory_bytes, less the page centroids' share when sparse). Unlike the native engine,
vLLM does not resize its cache at wake: memory a colocated trainer takes after the start must be
given back during the rollout (trainer.offload_during_rollout; wake() says so when it is not).
Attention is FLASH_ATTN, or, when the engine starts with a schedule that makes a layer sparse,
the project's block-sparse backend (plugin.py, sparse_backend.py: vLLM's CUSTOM backend,
16-token blocks, the V1 model runner), which set_schedule then feeds through the worker
extension; an engine started dense refuses a sparse schedule. The sampler's FlashInfer path is
off: scripts/pack_vllm.sh leaves FlashInfer out. Sleep level 1 frees the KV cache and moves the
weights to host memory; update_weights while asleep brings the weights back first, wake() the
rest. Tested on a GPU only (tests/vllm/test_vllm_engine_gpu.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparrow.engine.config import EngineConfig
from sparrow.engine.sequence import SampleResult
from sparrow.engine.validate import SamplingParams, check_request, params_per_prompt, sample_seed
from sparrow.model import read_arch
from sparrow.sparse import Schedule
from sparrow.vllm import VllmBackendError, require_vllm
from sparrow.vllm.outputs import sampling_kwargs, to_sample_result

ATTENTION_BACKEND = "FLASH_ATTN"
SPARSE_ATTENTION_BACKEND = "CUSTOM"  # registered by plugin.py
SPARSE_BLOCK_SIZE = 16  # sparse_backend.BLOCK_SIZE (that module imports vllm)
# vLLM refuses a request asking for more top logprobs than this
MAX_LOGPROBS = 64
SLEEP_LEVEL = 1  # 2 would drop the weights, which a rollout without a sync before it needs


@dataclass(frozen=True)
class KVCapacity:
    """vLLM's KV cache: blocks (`num_pages`) of `page_size` tokens."""

    num_pages: int
    page_size: int


class VllmEngine:
    # capabilities (sparrow/engine/protocol.py): whole batches only, vLLM's own graphs, CUDA
    takes_feed = False
    keeps_graphs = False
    needs_cuda = True
    graphs = None

    def __init__(
        self,
        model_path: str,
        config: EngineConfig,
        tokenizer: Any = None,
        schedule: Schedule | None = None,
        dtype: str = "bfloat16",
        device: str = "cuda",
    ):
        require_vllm()
        if not str(device).startswith("cuda"):
            raise VllmBackendError(
                f"rollout.backend=vllm needs a CUDA GPU; this actor's device "
                f"is {device!r} (rollout.backend=native runs on CPU)"
            )
        self.arch = read_arch(model_path)
        self.config, self.tokenizer = config, tokenizer
        self.max_context = config.max_context or self.arch.max_position_embeddings
        self.schedule: Schedule | None = None
        # the attention backend is fixed when vLLM starts: sparse only if asked from the start
        self.sparse_backend = self._makes_sparse(schedule)
        if self.sparse_backend and config.page_size != SPARSE_BLOCK_SIZE:
            raise VllmBackendError(
                f"the sparse vLLM backend needs page_size "
                f"{SPARSE_BLOCK_SIZE} (vLLM's block), got {config.page_size}"
            )
        self.llm = _start_llm(str(model_path), config, dtype, self.max_context, self.sparse_backend)
        self._calls = 0
        self._weights_awake = self._kv_awake = True
        self._released = 0  # device bytes vLLM gave back asleep and takes again at wake
        self.set_schedule(schedule)

    @classmethod
    def from_checkpoint(
        cls,
        weights_path: str,
        config: EngineConfig,
        tokenizer: Any,
        schedule: Schedule | None,
        dtype: str,
        device: str,
    ) -> VllmEngine:
        return cls(weights_path, config, tokenizer, schedule, dtype=dtype, device=device)

    @property
    def stats(self) -> dict[str, float]:
        """No step counts: vLLM schedules its own steps."""
        return {}

    # the trainer's hooks

    def _makes_sparse(self, schedule: Schedule | None) -> bool:
        return schedule is not None and any(
            schedule.is_sparse_layer(i) for i in range(self.arch.num_layers)
        )

    def set_schedule(self, schedule: Schedule | None) -> None:
        """Decode with this schedule from the next generate() on (None: dense). A schedule
        with a sparse layer needs the engine to have started with one (the sparse backend)."""
        sparse = self._makes_sparse(schedule)
        if sparse and not self.sparse_backend:
            raise VllmBackendError(
                f"this vLLM engine started with dense attention (FLASH_ATTN) and decodes "
                f"densely; it cannot take the sparse schedule {schedule.name!r}: start it with "
                f"a sparse schedule (the block-sparse vLLM backend), or use "
                f"rollout.backend=native"
            )
        if sparse and schedule.page_size != SPARSE_BLOCK_SIZE:
            raise VllmBackendError(
                f"schedule {schedule.name!r} has page_size "
                f"{schedule.page_size}; vLLM's blocks hold {SPARSE_BLOCK_SIZE}"
            )
        if self.sparse_backend:
            layers = self.llm.collective_rpc(
                "sparrow_set_schedule", args=(schedule if sparse else None,)
            )
            if min(layers) < self.arch.num_layers:
                raise VllmBackendError(
                    f"the sparse vLLM backend holds {min(layers)} of "
                    f"{self.arch.num_layers} attention layers"
                )
        self.schedule = schedule if sparse else None

    def update_weights(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copy trainer weights (transformers names) into vLLM's model in place; KV blocks
        cached under the old weights are dropped."""
        if not self._weights_awake:
            before = _free_bytes()
            self.llm.wake_up(tags=["weights"])
            if before is not None:
                self._released = max(0, self._released - max(0, before - _free_bytes()))
            self._weights_awake = True
        self.llm.collective_rpc("sparrow_load_weights", args=(state_dict, strict))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the KV cache and move the weights to host memory (vLLM sleep mode)."""
        if not (self._weights_awake or self._kv_awake):
            return
        self.wake()  # vLLM sleeps from a fully awake state
        before = _free_bytes()
        self.llm.sleep(level=SLEEP_LEVEL)
        self._released = 0 if before is None else max(0, _free_bytes() - before)
        self._weights_awake = self._kv_awake = False

    def wake(self) -> None:
        """Take back the KV cache (and the weights, unless a weight load brought them): the
        same size as at start, since vLLM does not resize it. VllmBackendError, before vLLM
        tries, when the device has less free memory than that (a colocated trainer that kept
        its state: trainer.offload_during_rollout)."""
        tags = [
            tag
            for tag, awake in (("weights", self._weights_awake), ("kv_cache", self._kv_awake))
            if not awake
        ]
        if tags:
            free = _free_bytes()
            if free is not None and self._released > free:
                raise VllmBackendError(
                    f"vLLM cannot wake: its {' and '.join(tags)} need "
                    f"{self._released / 2**30:.1f} GiB of the GPU again (vLLM does not resize "
                    f"its cache) but {free / 2**30:.1f} GiB are free; a colocated trainer holds "
                    f"the rest: set trainer.offload_during_rollout=true, or start vLLM smaller "
                    f"(rollout.gpu_memory_utilization or rollout.kv_cache_mib)"
                )
            self.llm.wake_up(tags=tags)
            self.llm.reset_prefix_cache()  # the blocks' contents are gone
            self._weights_awake = self._kv_awake = True
            self._released = 0

    @property
    def cache(self) -> KVCapacity | None:
        """The KV cache's size while awake, None while asleep (as the native engine's)."""
        if not self._kv_awake:
            return None
        cache = self.llm.llm_engine.vllm_config.cache_config
        return KVCapacity(int(cache.num_gpu_blocks or 0), int(cache.block_size))

    # generation

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        progress: bool = False,
    ) -> list[list[SampleResult]]:
        """Samples for every prompt: outer list per prompt, inner per sample (params.n)."""
        import vllm

        per_prompt = params_per_prompt(prompts, params)
        self.wake()
        self._calls += 1
        requests, vllm_params, keys = [], [], []
        for index, (prompt, request) in enumerate(zip(prompts, per_prompt)):
            prompt = [int(t) for t in prompt]
            check_request(
                index,
                prompt,
                request,
                self.arch.vocab_size,
                self.max_context,
                self.config.max_batch_size,
            )
            stop = self._stop_ids(request)
            for sample in range(request.n):
                seed = sample_seed(request, sample, (self.config.seed, self._calls, index))
                requests.append({"prompt_token_ids": prompt})
                vllm_params.append(vllm.SamplingParams(**sampling_kwargs(request, seed, stop)))
                keys.append((index, sample, len(prompt), request.logprobs_topk))
        outputs = self.llm.generate(requests, vllm_params, use_tqdm=progress)
        results: list[list[SampleResult]] = [[] for _ in per_prompt]
        for (index, sample, prompt_len, topk), output in zip(keys, outputs):
            completion = output.outputs[0]
            results[index].append(
                to_sample_result(
                    completion,
                    index,
                    sample,
                    prompt_len,
                    self.config.page_size,
                    topk,
                    self._text(completion.token_ids),
                    self.schedule,
                )
            )
        return results

    def _stop_ids(self, params: SamplingParams) -> set[int]:
        stop = set(params.stop_token_ids)
        if not self.config.ignore_eos:
            stop |= set(self.arch.eos_token_ids)
        return stop

    def _text(self, ids: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        # as the native engine: the stop token ends the sample, not the text a verifier reads
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def shutdown(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def _device_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the current CUDA device, every process's use counted; None
    without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def _free_bytes() -> int | None:
    memory = _device_memory()
    return None if memory is None else memory[0]


def _instance_share(target: float) -> float:
    """vLLM's gpu_memory_utilization for a device-wide target: the target less the share other
    processes use now (the native engine's meaning of rollout.gpu_memory_utilization)."""
    memory = _device_memory()
    if memory is None:
        return target
    free, total = memory
    share = target - (total - free) / total
    if share < 0.05:
        raise VllmBackendError(
            f"rollout.gpu_memory_utilization={target} leaves vLLM {max(share, 0):.0%} of the GPU: "
            f"{(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB are in use already (a "
            f"colocated trainer?); raise it, offload the trainer during the rollout "
            f"(trainer.offload_during_rollout=true) or size the cache with rollout.kv_cache_mib"
        )
    return share


def _free_fraction(default: float) -> float:
    """Half the fraction of the current CUDA device free now, at most `default` (another
    process on the device may take more before vLLM looks)."""
    memory = _device_memory()
    if memory is None:
        return default
    free, total = memory
    return max(0.01, min(default, 0.5 * free / total))


def kv_bytes_beside_centroids(total_bytes: int, block_size: int) -> int:
    """vLLM's kv_cache_memory_bytes when the page centroids (one key-sized row per block,
    outside vLLM's budget) must fit in `total_bytes` too: K and V take 2 * block_size rows
    per block and layer, the centroid 1 more."""
    return total_bytes * 2 * block_size // (2 * block_size + 1)


def _start_llm(
    model_path: str, config: EngineConfig, dtype: str, max_context: int, sparse: bool = False
):
    # engine core and worker in this process: weights reach the model as tensors
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    backend = dict(attention_config={"backend": ATTENTION_BACKEND})
    if sparse:
        from sparrow.vllm import plugin

        os.environ[plugin.ENV] = "1"
        # the V2 runner gives the backend no is_prefilling (sparse_backend.py)
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        plugin.register()  # vLLM may have loaded the plugins before the variable was set
        backend = dict(
            attention_config={"backend": SPARSE_ATTENTION_BACKEND}, block_size=SPARSE_BLOCK_SIZE
        )
    import vllm

    if config.memory_utilization > 0:
        memory = dict(gpu_memory_utilization=_instance_share(float(config.memory_utilization)))
    else:
        total = int(config.kv_cache_mib * 2**20)
        if sparse:
            total = kv_bytes_beside_centroids(total, SPARSE_BLOCK_SIZE)
        # vLLM still checks gpu_memory_utilization x the device against free memory at start
        # (a colocated trainer or another engine may hold some): ask only for what is free
        memory = dict(
            kv_cache_memory_bytes=total, gpu_memory_utilization=_free_fraction(default=0.92)
        )
    return vllm.LLM(
        model=model_path,
        dtype=dtype,
        seed=config.seed,
        skip_tokenizer_init=True,
        generation_config="vllm",
        max_model_len=max_context,
        max_num_seqs=config.max_batch_size,
        max_logprobs=MAX_LOGPROBS,
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=True,
        enable_sleep_mode=True,
        distributed_executor_backend="uni",
        worker_extension_cls="sparrow.vllm.worker_extension.WeightLoader",
        **backend,
        **memory,
    )
