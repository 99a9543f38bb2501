"""Request checks before anything is scheduled: each failure is one EngineError with numbers.

    check_request(index, prompt_ids, params, vocab_size, max_context, max_batch_size)
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Sequence

from sparrow_core.engine.config import EngineError

if TYPE_CHECKING:
    from sparrow_core.engine.sampler import SamplingParams


def check_request(index: int, prompt: Sequence[int], params: "SamplingParams", vocab_size: int,
                  max_context: int, max_batch_size: int) -> None:
    """Refuse a prompt the engine could never serve (the page check is the engine's)."""
    if not prompt:
        raise EngineError(f"prompt {index} is empty")
    bad = [t for t in prompt
           if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size]
    if bad:
        raise EngineError(f"prompt {index} holds token ids outside [0, {vocab_size}): {bad[:5]}")
    total = len(prompt) + params.max_new_tokens
    if total > max_context:
        raise EngineError(
            f"prompt {index}: {len(prompt)} prompt tokens + max_new_tokens "
            f"{params.max_new_tokens} = {total} exceed the context of {max_context} tokens")
    if params.n > max_batch_size:
        raise EngineError(f"prompt {index} asks for n={params.n} samples but the engine runs "
                          f"at most max_batch_size={max_batch_size} sequences at once")
