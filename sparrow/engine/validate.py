"""Requests as the engine takes them in: SamplingParams (a frozen dataclass that checks
itself), checks before anything is scheduled (each failure is one EngineError with numbers)
and each sample's seed.

    per_prompt = params_per_prompt(prompts, params)   # one SamplingParams per prompt
    check_request(index, prompt_ids, params, vocab_size, max_context, max_batch_size)
    check_fits(index, params, prompt_len, pages_needed, page_size, num_pages)
    seed = sample_seed(params, sample_index, (engine_seed, call, prompt_index))
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparrow.engine.config import EngineError
from sparrow.errors import SparrowError


class SamplingError(SparrowError, ValueError):
    """Invalid sampling parameters or sampler inputs; the message names the field."""


@dataclass(frozen=True)
class SamplingParams:
    # 0 means greedy
    temperature: float = 1.0
    # nucleus mass kept; 1.0 keeps everything
    top_p: float = 1.0
    # keep the k most likely tokens; 0 keeps all
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    # None: the engine derives a seed from its own
    seed: int | None = None
    # samples per prompt
    n: int = 1
    # top tokens and logprobs recorded per generated token
    logprobs_topk: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("top_k", "logprobs_topk"):
            if getattr(self, name) < 0:
                raise SamplingError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_new_tokens", "n"):
            if getattr(self, name) < 1:
                raise SamplingError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(t < 0 for t in self.stop_token_ids):
            raise SamplingError(f"stop_token_ids must be >= 0, got {list(self.stop_token_ids)}")
        if self.seed is not None and (isinstance(self.seed, bool) or self.seed < 0):
            raise SamplingError(f"seed must be None or an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def params_per_prompt(prompts: Sequence, params) -> list[SamplingParams]:
    """One SamplingParams for all prompts, or one each."""
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise EngineError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
    return params


def sample_seed(params: SamplingParams, sample_index: int, fallback: tuple[int, ...]) -> int:
    """A sample's 63-bit seed: from the request's seed and the sample index, so a seeded
    request draws the same whatever runs beside it; else from `fallback` (engine seed,
    generate() call number, prompt index) and the sample index."""
    if params.seed is not None:
        entropy = [params.seed, sample_index]
    else:
        entropy = [*fallback, sample_index]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def check_request(
    index: int,
    prompt: Sequence[int],
    params: SamplingParams,
    vocab_size: int,
    max_context: int,
    max_batch_size: int,
) -> None:
    """Refuse a prompt the engine could never serve (the page check is the engine's)."""
    if not prompt:
        raise EngineError(f"prompt {index} is empty")
    bad = [
        t
        for t in prompt
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size
    ]
    if bad:
        raise EngineError(f"prompt {index} holds token ids outside [0, {vocab_size}): {bad[:5]}")
    total = len(prompt) + params.max_new_tokens
    if total > max_context:
        raise EngineError(
            f"prompt {index}: {len(prompt)} prompt tokens + max_new_tokens "
            f"{params.max_new_tokens} = {total} exceed the context of {max_context} tokens"
        )
    if params.n > max_batch_size:
        raise EngineError(
            f"prompt {index} asks for n={params.n} samples but the engine runs "
            f"at most max_batch_size={max_batch_size} sequences at once"
        )


def check_fits(
    index: int, params: SamplingParams, prompt_len: int, needed: int, page_size: int, num_pages: int
) -> None:
    """Refuse a prompt group whose worst case (`needed` pages) exceeds the whole cache."""
    if needed > num_pages:
        raise EngineError(
            f"prompt {index} can never fit: {params.n} sample(s) of {prompt_len} prompt + "
            f"{params.max_new_tokens} new tokens need {needed} KV pages of {page_size} tokens, "
            f"the cache holds {num_pages} (raise kv_cache_mib or lower max_new_tokens / n)"
        )
