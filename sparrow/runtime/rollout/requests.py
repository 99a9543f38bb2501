"""The rollout requests of a step: one SamplingParams per prompt row, seeded per (run, step,
prompt), its generation cut to the room the model's context leaves; a carried sample's
resumed request seeded per (step, prompt, sample) (resume_seed).

    params = sampling_params(runtime, rows, step)               # the rollout stage's
    params = sampling_params(runtime, rows, step, greedy=True)  # the evaluate stage's
    max_new_tokens_for(runtime, row, source)   # PromptTooLongError when no room is left

Each prompt's request carries a seed derived from (pipeline.seed, rollout.seed, step,
prompt); the engine derives each sample's seed from it and the sample index, so results do
not depend on how prompts are sharded across actors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparrow.data.datasets import context_error
from sparrow.engine import SamplingParams

if TYPE_CHECKING:
    from sparrow.runtime.run_runtime import RunRuntime


def request_seed(run_seed: int, rollout_seed: int, step: int, prompt_index: int) -> int:
    """A 63-bit seed per (run seed, rollout seed, step, prompt); the engine adds the sample."""
    entropy = [
        abs(run_seed),
        int(run_seed < 0),
        abs(rollout_seed),
        int(rollout_seed < 0),
        step,
        prompt_index,
    ]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def resume_seed(
    run_seed: int, rollout_seed: int, step: int, prompt_index: int, sample_index: int
) -> int:
    """The seed of one carried sample's resumed request at `step` (its prompt's position in
    that step's rollout): a stream of its own beside request_seed's (docs/async.md)."""
    entropy = [abs(run_seed), int(run_seed < 0), abs(rollout_seed), int(rollout_seed < 0)]
    entropy += [step, prompt_index, sample_index, 1]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def max_new_tokens_for(runtime: RunRuntime, row: Any, source: str) -> int:
    """rollout.max_new_tokens, cut to the room the context leaves after the prompt."""
    room = runtime.max_context - len(row.prompt_ids)
    if room < 1:
        raise context_error(source, row.row, len(row.prompt_ids), runtime.max_context)
    return min(runtime.cfg.rollout.max_new_tokens, room)


def sampling_params(
    runtime: RunRuntime,
    rows: Sequence[Any],
    step: int,
    greedy: bool = False,
    source: str = "",
    first_index: int = 0,
) -> list[SamplingParams]:
    """One request per prompt row; `source` names the dataset in errors (data.train if empty);
    first_index: the seed index of the first row (dynamic sampling's later draws)."""
    rollout = runtime.cfg.rollout
    source = source or runtime.cfg.data.train
    return [
        SamplingParams(
            temperature=0.0 if greedy else rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=max_new_tokens_for(runtime, row, source),
            seed=request_seed(runtime.cfg.pipeline.seed, rollout.seed, step, first_index + index),
            n=1 if greedy else rollout.samples_per_prompt,
            logprobs_topk=rollout.logprobs_topk,
        )
        for index, row in enumerate(rows)
    ]
