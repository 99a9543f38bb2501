"""pass@k against a count over every k-subset of the samples, accuracy and grouping by
data_source, metric names MLflow accepts.

python -m pytest tests/data/test_eval_scores.py -q
"""

from __future__ import annotations

import itertools

import pytest

from sparrow.data.eval_scores import (
    EvalScoreError,
    default_ks,
    metric_source,
    pass_at_k,
    scores_by_source,
)


def pass_at_k_by_subsets(correct: list[bool], k: int) -> float:
    """The share of the k-subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_subsets(samples, k), abs=1e-12)


def test_known_values():
    assert pass_at_k(8, 3, 4) == pytest.approx(1 - 5 / 70)  # C(5,4) / C(8,4)
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(200, 2, 100) == pytest.approx(1 - (100 * 99) / (200 * 199))


def test_bad_k_or_count_is_refused():
    with pytest.raises(EvalScoreError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(EvalScoreError, match="correct"):
        pass_at_k(4, 5, 1)


def test_default_ks():
    assert default_ks(1) == (1,)
    assert default_ks(8) == (1, 2, 4, 8)
    assert default_ks(6) == (1, 2, 4, 6)


def test_scores_group_prompts_by_source_and_average_over_prompts():
    sources = ["b", "a", "b", "a"]
    rewards = [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    a, b = scores_by_source(sources, rewards, ks=(1, 2, 3))
    assert (a.data_source, a.prompts, a.samples_per_prompt) == ("a", 2, 3)
    assert a.accuracy == pytest.approx(0.5)
    assert a.pass_at == pytest.approx({1: 0.5, 2: 0.5, 3: 0.5})
    assert b.accuracy == pytest.approx(0.5)
    by_subsets = {
        k: (
            pass_at_k_by_subsets([True, False, False], k)
            + pass_at_k_by_subsets([True, True, False], k)
        )
        / 2
        for k in (1, 2, 3)
    }
    assert b.pass_at == pytest.approx(by_subsets)
    assert b.pass_at[2] == pytest.approx((2 / 3 + 1) / 2)


def test_only_full_credit_counts_as_correct_but_accuracy_is_the_mean_reward():
    [only] = scores_by_source([""], [[0.5, 0.5]], ks=(1, 2))
    assert only.accuracy == 0.5 and only.pass_at == {1: 0.0, 2: 0.0}
    [bonus] = scores_by_source([""], [[1.2, 0.2]], ks=(1,))  # a format bonus above 1 counts
    assert bonus.pass_at[1] == 0.5


def test_ragged_samples_are_refused():
    with pytest.raises(EvalScoreError, match="same number"):
        scores_by_source(["a", "a"], [[1.0], [1.0, 0.0]], ks=(1,))


def test_metric_source_keeps_what_mlflow_accepts():
    from mlflow.utils.validation import _validate_metric_name

    assert metric_source("openai/gsm8k") == "openai/gsm8k"
    assert metric_source("AI-MO/aime@2024+x") == "AI-MO/aime_2024_x"
    assert metric_source("") == "_"
    for source in ("openai/gsm8k", "a@b", "../x", "/lead"):
        _validate_metric_name(f"eval/{metric_source(source)}/pass_at_4")
