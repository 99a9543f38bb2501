"""Rewards per data_source: each sample scored by the reward its row's data_source routes to.

    from sparrow.data.reward_routing import score_samples
    batch = score_samples("math", {"codecontests*": "code", "my/*": "./r.py:score"},
                          completions, answers, sources, extra_infos, timeout_s=10.0)

data.reward_by_source maps fnmatch patterns to reward specs (any form data.reward takes:
docs/rewards.md); a sample's data_source is matched against the patterns in order and the
first match wins; a sample no pattern matches (plain rows have data_source "") is scored by
data.reward. Each reward runs once over its own samples (sparrow.data.reward_runner) and the
results come back in input order, merged into one RewardBatch whose first_error names the
sample's index in the whole batch and its reward. With format_reward f, a sample scored by
"math" whose response is well formed (thinking closed, a final \\boxed{}) gets f added.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from sparrow.data.reward_runner import RewardBatch, score_completions
from sparrow.data.rewards import math_well_formed

_SAMPLE = re.compile(r"^sample (\d+): ")


def reward_for_source(source: str, default: str, by_source: Mapping[str, str]) -> str:
    """The reward spec of a data_source: the first matching pattern's, else `default`."""
    for pattern, spec in by_source.items():
        if fnmatch.fnmatchcase(source, pattern):
            return spec
    return default


def score_samples(
    default: str,
    by_source: Mapping[str, str],
    completions: Sequence[str],
    answers: Sequence[str],
    sources: Sequence[str],
    extra_infos: Sequence[str],
    timeout_s: float,
    format_reward: float = 0.0,
) -> RewardBatch:
    """Every sample scored by its source's reward (see the module doc), in input order."""
    specs = [reward_for_source(s, default, by_source) for s in sources]
    rewards = [0.0] * len(completions)
    errors = timeouts = 0
    failures: list[tuple[int, str, str | None]] = []  # (sample, message, traceback)
    for spec in dict.fromkeys(specs):  # each reward once, in order of first use
        indices = [i for i, s in enumerate(specs) if s == spec]
        batch = score_completions(
            spec,
            [completions[i] for i in indices],
            [answers[i] for i in indices],
            timeout_s=timeout_s,
            data_sources=[sources[i] for i in indices],
            extra_infos=[extra_infos[i] for i in indices],
        )
        for local, value in enumerate(batch.rewards):
            rewards[indices[local]] = value
        errors, timeouts = errors + batch.errors, timeouts + batch.timeouts
        if batch.first_error is not None:
            local = _SAMPLE.match(batch.first_error)
            sample = indices[int(local.group(1))] if local else indices[0]
            message = _SAMPLE.sub("", batch.first_error)
            failures.append((sample, f"sample {sample} ({spec}): {message}", batch.first_traceback))
    if format_reward:
        for i, spec in enumerate(specs):
            if spec == "math" and math_well_formed(completions[i]):
                rewards[i] += format_reward
    failures.sort(key=lambda failure: failure[0])
    return RewardBatch(
        rewards=rewards,
        errors=errors,
        timeouts=timeouts,
        first_error=failures[0][1] if failures else None,
        first_traceback=next((t for _, _, t in failures if t), None),
    )
