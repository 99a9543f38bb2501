"""Rewards routed by data_source, extra_info handed to functions that take it, the format
reward, and math answers after the thinking block.

python -m pytest tests/data/test_reward_routing.py -q
"""

from __future__ import annotations

import pytest

from sparrow.data.reward_routing import reward_for_source, score_samples
from sparrow.data.reward_spec import load_reward, reward_keywords
from sparrow.data.rewards import final_response, math_reward, math_well_formed

USER_REWARD = '''
def score(completion, answer, extra_info=None, data_source=""):
    """1 + extra_info's bonus when the completion equals the answer; names its source."""
    if data_source == "boom":
        raise ValueError("a bad row")
    return float(completion == answer) + extra_info.get("bonus", 0)


def plain(completion, answer):
    return 0.5
'''


@pytest.fixture
def user_reward(tmp_path):
    path = tmp_path / "user_reward.py"
    path.write_text(USER_REWARD)
    return f"{path}:score"


def test_patterns_route_in_order_and_fall_back_to_the_default():
    routes = {"aime*": "math", "openai/gsm8k": "math", "*code*": "code", "*": "exact_match"}
    assert reward_for_source("aime2024", "x", routes) == "math"
    assert reward_for_source("openai/gsm8k", "x", routes) == "math"
    assert reward_for_source("codecontests", "x", routes) == "code"
    assert reward_for_source("other", "x", routes) == "exact_match"
    assert reward_for_source("", "x", {"aime*": "math"}) == "x"


def test_keywords_a_function_takes(user_reward):
    assert reward_keywords(load_reward(user_reward)) == {"extra_info", "data_source"}
    assert reward_keywords(load_reward(user_reward.replace(":score", ":plain"))) == set()
    assert reward_keywords(lambda c, a, **kw: 0.0) == {"extra_info", "data_source"}
    assert reward_keywords(math_reward) == set()


def test_each_sample_is_scored_by_its_sources_reward(user_reward):
    completions = [r"so \boxed{4}", "7", "7", r"\boxed{5}", "x"]
    answers = ["4", "7", "7", "4", "x"]
    sources = ["aime", "mine", "mine", "aime", "plain"]
    extras = ["", '{"bonus": 0.25}', "", "", ""]
    batch = score_samples(
        "exact_match",
        {"aime*": "math", "mine": user_reward},
        completions,
        answers,
        sources,
        extras,
        timeout_s=30.0,
    )
    # a plain loop over the samples, each with the function its source names
    expected = []
    for completion, answer, source, extra in zip(completions, answers, sources, extras):
        if source == "aime":
            expected.append(math_reward(completion, answer))
        elif source == "mine":
            expected.append(float(completion == answer) + (0.25 if extra else 0.0))
        else:
            expected.append(float(completion == answer))
    assert batch.rewards == expected == [1.0, 1.25, 1.0, 0.0, 1.0]
    assert (batch.errors, batch.first_error) == (0, None)


def test_a_failure_is_named_by_its_index_in_the_whole_batch(user_reward):
    batch = score_samples(
        "exact_match",
        {"boom": user_reward},
        ["a", "b", "c"],
        ["a", "b", "c"],
        ["", "", "boom"],
        ["", "", ""],
        timeout_s=30.0,
    )
    assert batch.rewards == [1.0, 1.0, 0.0]
    assert batch.errors == 1
    assert batch.first_error.startswith(f"sample 2 ({user_reward}): ValueError: a bad row")
    assert "a bad row" in batch.first_traceback


@pytest.mark.parametrize(
    "completion, region, reward, well_formed",
    [
        (r"<think>maybe \boxed{3}</think> so \boxed{4}", r" so \boxed{4}", 1.0, True),
        (r"<think>it is \boxed{4}</think> I am not sure", " I am not sure", 0.0, False),
        (r"<think>cut while thinking \boxed{4}", None, 0.0, False),
        (r"template opened the block \boxed{2}</think>\boxed{4}", r"\boxed{4}", 1.0, True),
        (r"no thinking at all: \boxed{4}", r"no thinking at all: \boxed{4}", 1.0, True),
        (r"<think>ok</think> \boxed{5}", r" \boxed{5}", 0.0, True),
    ],
)
def test_math_grades_the_last_boxed_answer_after_the_thinking_block(
    completion, region, reward, well_formed
):
    assert final_response(completion) == region
    assert math_reward(completion, "4") == reward
    assert math_well_formed(completion) is well_formed


def test_the_format_reward_goes_to_well_formed_math_samples_only():
    completions = [r"<think>a</think>\boxed{4}", r"<think>a</think>\boxed{5}", "<think>a", "4"]
    batch = score_samples(
        "math",
        {"plain": "exact_match"},
        completions,
        ["4"] * 4,
        ["", "", "", "plain"],
        [""] * 4,
        timeout_s=30.0,
        format_reward=0.1,
    )
    assert batch.rewards == pytest.approx([1.1, 0.1, 0.0, 1.0])
