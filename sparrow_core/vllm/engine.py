"""VllmEngine: vLLM 0.23.0's LLM behind the native Engine's calls (dense decode, one GPU).

    engine = VllmEngine(weights_path, EngineConfig(max_batch_size=64), tokenizer=tokenizer)
    results = engine.generate(prompt_ids, [SamplingParams(...), ...])  # [prompt][sample]
    engine.update_weights(state_dict)   # transformers names, in place; prefix cache reset
    engine.sleep(); engine.wake()       # vLLM sleep mode level 1 between rollout and training
    engine.set_schedule(None)           # a sparse schedule is refused (no sparse plugin yet)

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the "uni" executor), so the
trainer's tensors reach its model without a copy through a socket: update_weights calls the
worker extension (worker_extension.py) by name through LLM.collective_rpc. Requests go as token
ids (no vLLM tokenizer: skip_tokenizer_init) with one vLLM request per sample and the
sample's seed (outputs.py); text is decoded with the project's tokenizer as the native engine
does. The KV cache is sized by EngineConfig.memory_utilization (vLLM's
gpu_memory_utilization) when set, else kv_cache_mib (kv_cache_memory_bytes). Attention is
FLASH_ATTN and the sampler's FlashInfer path is off: scripts/pack_vllm.sh leaves FlashInfer
out. Sleep level 1 frees the KV cache and moves the weights to host memory; update_weights
while asleep brings the weights back first, wake() the rest. Tested on a GPU only
(tests/sparrow_core/vllm/test_vllm_engine_gpu.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sparrow_core.engine.config import EngineConfig
from sparrow_core.engine.sequence import SampleResult
from sparrow_core.engine.validate import (SamplingParams, check_request, params_per_prompt,
                                          sample_seed)
from sparrow_core.model import read_arch
from sparrow_core.sparse import Schedule
from sparrow_core.vllm import VllmBackendError, require_vllm
from sparrow_core.vllm.outputs import sampling_kwargs, to_sample_result

ATTENTION_BACKEND = "FLASH_ATTN"
# vLLM refuses a request asking for more top logprobs than this
MAX_LOGPROBS = 64
SLEEP_LEVEL = 1  # 2 would drop the weights, which a rollout without a sync before it needs


@dataclass(frozen=True)
class KVCapacity:
    """vLLM's KV cache: blocks (`num_pages`) of `page_size` tokens."""

    num_pages: int
    page_size: int


class VllmEngine:
    def __init__(self, model_path: str, config: EngineConfig, tokenizer: Any = None,
                 schedule: Schedule | None = None, dtype: str = "bfloat16",
                 device: str = "cuda"):
        require_vllm()
        if not str(device).startswith("cuda"):
            raise VllmBackendError(f"rollout.backend=vllm needs a CUDA GPU; this actor's device "
                                   f"is {device!r} (rollout.backend=native runs on CPU)")
        self.arch = read_arch(model_path)
        self.config, self.tokenizer = config, tokenizer
        self.max_context = config.max_context or self.arch.max_position_embeddings
        self.schedule: Schedule | None = None
        self.set_schedule(schedule)
        self.llm = _start_llm(str(model_path), config, dtype, self.max_context)
        self._calls = 0
        self._weights_awake = self._kv_awake = True

    # the trainer's hooks

    def set_schedule(self, schedule: Schedule | None) -> None:
        """None (dense) only: a schedule that makes any layer sparse is refused."""
        if schedule is not None and any(schedule.is_sparse_layer(i)
                                        for i in range(self.arch.num_layers)):
            raise VllmBackendError(
                f"rollout.backend=vllm decodes densely (the block-sparse vLLM plugin is not "
                f"built); it cannot take the sparse schedule {schedule.name!r}: run with "
                f"schedule.sparse=false, or rollout.backend=native for sparse decode")
        self.schedule = None

    def update_weights(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copy trainer weights (transformers names) into vLLM's model in place; KV blocks
        cached under the old weights are dropped."""
        if not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        self.llm.collective_rpc("sparrow_load_weights", args=(state_dict, strict))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the KV cache and move the weights to host memory (vLLM sleep mode)."""
        if not (self._weights_awake or self._kv_awake):
            return
        self.wake()  # vLLM sleeps from a fully awake state
        self.llm.sleep(level=SLEEP_LEVEL)
        self._weights_awake = self._kv_awake = False

    def wake(self) -> None:
        tags = [tag for tag, awake in (("weights", self._weights_awake),
                                       ("kv_cache", self._kv_awake)) if not awake]
        if tags:
            self.llm.wake_up(tags=tags)
            self.llm.reset_prefix_cache()  # the blocks' contents are gone
            self._weights_awake = self._kv_awake = True

    @property
    def cache(self) -> KVCapacity | None:
        """The KV cache's size while awake, None while asleep (as the native engine's)."""
        if not self._kv_awake:
            return None
        cache = self.llm.llm_engine.vllm_config.cache_config
        return KVCapacity(int(cache.num_gpu_blocks or 0), int(cache.block_size))

    # generation

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams],
                 progress: bool = False) -> list[list[SampleResult]]:
        """Samples for every prompt: outer list per prompt, inner per sample (params.n)."""
        import vllm

        per_prompt = params_per_prompt(prompts, params)
        self.wake()
        self._calls += 1
        requests, vllm_params, keys = [], [], []
        for index, (prompt, request) in enumerate(zip(prompts, per_prompt)):
            prompt = [int(t) for t in prompt]
            check_request(index, prompt, request, self.arch.vocab_size, self.max_context,
                          self.config.max_batch_size)
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
            results[index].append(to_sample_result(
                completion, index, sample, prompt_len, self.config.page_size, topk,
                self._text(completion.token_ids)))
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


def _start_llm(model_path: str, config: EngineConfig, dtype: str, max_context: int):
    # engine core and worker in this process: weights reach the model as tensors
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import vllm

    if config.memory_utilization > 0:
        memory = dict(gpu_memory_utilization=float(config.memory_utilization))
    else:
        memory = dict(kv_cache_memory_bytes=int(config.kv_cache_mib * 2**20))
    return vllm.LLM(
        model=model_path, dtype=dtype, seed=config.seed, skip_tokenizer_init=True,
        generation_config="vllm", max_model_len=max_context,
        max_num_seqs=config.max_batch_size, max_logprobs=MAX_LOGPROBS,
        logprobs_mode="processed_logprobs", enable_prefix_caching=True,
        enable_sleep_mode=True, distributed_executor_backend="uni",
        worker_extension_cls="sparrow_core.vllm.worker_extension.WeightLoader",
        attention_config={"backend": ATTENTION_BACKEND}, **memory)
