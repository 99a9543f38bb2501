"""Evaluation scores per data_source: mean accuracy and the unbiased pass@k.

    from sparrow.data.eval_scores import pass_at_k, scores_by_source
    pass_at_k(n=8, correct=3, k=4)                       # 0.9286
    scores = scores_by_source(["gsm8k", "aime"], [[1.0, 0.0], [0.0, 0.0]], ks=(1, 2))
    scores[0].data_source, scores[0].accuracy, scores[0].pass_at[2]   # "aime", 0.0, 0.0

pass@k is the chance that at least one of k samples drawn without replacement from a
prompt's n samples is correct, averaged over prompts: 1 - C(n - c, k) / C(n, k) for c correct
(Chen et al. 2021, "Evaluating Large Language Models Trained on Code"); it is unbiased where
the fraction of c among n is not. Computed with exact integer binomials (the paper's product
form exists to avoid overflow in floats; Python's integers do not overflow).

A sample is correct when its reward reaches FULL_CREDIT: 0/1 rewards (exact_match, math) then
count their 1s; a graded reward (share_match) counts only its full marks. Accuracy is the
mean reward itself, so for 0/1 rewards it equals pass@1.
Tests: `python -m pytest tests/data/test_eval_scores.py -q` (against a count over subsets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparrow.errors import SparrowError

FULL_CREDIT = 1.0
# what MLflow accepts in a metric name (letters, digits, _ - . / space :); a data_source
# such as "openai/gsm8k" keeps its slash, anything else becomes "_"
_METRIC_UNSAFE = re.compile(r"[^\w.\- /:]")


class EvalScoreError(SparrowError, ValueError):
    """Scores asked of inputs that cannot give them (k above n, ragged samples)."""


def pass_at_k(n: int, correct: int, k: int) -> float:
    """1 - C(n - correct, k) / C(n, k): the unbiased pass@k of one prompt's n samples."""
    if not 1 <= k <= n:
        raise EvalScoreError(f"pass@{k} needs 1 <= k <= n samples, got n={n}")
    if not 0 <= correct <= n:
        raise EvalScoreError(f"{correct} correct samples out of n={n}")
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def default_ks(n: int) -> tuple[int, ...]:
    """1, 2, 4, ... below n, and n: the k that pass@k is reported for when none are set."""
    powers = [1 << i for i in range(n.bit_length()) if 1 << i < n]
    return (*powers, n)


@dataclass(frozen=True)
class SourceScore:
    """One data_source's evaluation: its prompts, samples per prompt, mean reward and
    pass@k by k."""

    data_source: str
    prompts: int
    samples_per_prompt: int
    accuracy: float
    pass_at: dict[int, float] = field(default_factory=dict)


def score(data_source: str, rewards: Sequence[Sequence[float]], ks: Sequence[int]) -> SourceScore:
    """The score of prompts whose samples got `rewards` (one list per prompt, all of n)."""
    sizes = {len(samples) for samples in rewards}
    if len(sizes) != 1 or 0 in sizes:
        raise EvalScoreError(
            f"data_source {data_source!r}: every prompt needs the same number (>= 1) of "
            f"samples, got {sorted(sizes)}"
        )
    n = sizes.pop()
    pass_at = {
        k: sum(pass_at_k(n, sum(r >= FULL_CREDIT for r in samples), k) for samples in rewards)
        / len(rewards)
        for k in ks
    }
    total = sum(sum(samples) for samples in rewards)
    return SourceScore(data_source, len(rewards), n, total / (n * len(rewards)), pass_at)


def scores_by_source(
    sources: Sequence[str], rewards: Sequence[Sequence[float]], ks: Sequence[int]
) -> list[SourceScore]:
    """One SourceScore per distinct data_source (sorted by name), prompt i in sources[i]."""
    if len(sources) != len(rewards):
        raise EvalScoreError(f"{len(sources)} data_sources for {len(rewards)} prompts")
    grouped: dict[str, list[Sequence[float]]] = {}
    for source, samples in zip(sources, rewards):
        grouped.setdefault(source, []).append(samples)
    return [score(source, grouped[source], ks) for source in sorted(grouped)]


def metric_source(data_source: str) -> str:
    """The data_source as a piece of a metric name (eval/<source>/accuracy)."""
    safe = _METRIC_UNSAFE.sub("_", data_source).replace("..", "_").strip("/")
    return safe or "_"
