"""Reward functions on real cases: math-verify equivalences, boxed extraction, exact match."""

import threading

import pytest

from sparrow.data.rewards import REWARD_FUNCTIONS, final_answer, last_boxed

MATH = REWARD_FUNCTIONS.get("math")
EXACT = REWARD_FUNCTIONS.get("exact_match")


@pytest.mark.parametrize(
    "completion, answer, want",
    [
        (r"Half of it: \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"so $x = \boxed{2\sqrt{2}}$", r"\sqrt{8}", 1.0),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),  # nested braces
        (r"\boxed{x^{2}+1}", "1+x^2", 1.0),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),  # escaped braces inside
        (r"\boxed {7}", r"\boxed{7}", 1.0),  # boxed ground truth, space before the brace
        (r"\boxed{3}", "4", 0.0),
        (r"\boxed{\frac{1}{3}}", "0.33", 0.0),
        (r"first \boxed{3}, on reflection \boxed{4}", "3", 0.0),  # the last one counts
        (r"first \boxed{4}, on reflection \boxed{3}", "3", 1.0),
        (r"\boxed{3} then a truncated \boxed{\frac{1", "3", 1.0),
        ("the answer is 3", "3", 0.0),  # no boxed answer
        (r"\boxed{}", "3", 0.0),
    ],
)
def test_math_reward(completion, answer, want):
    assert MATH(completion, answer) == want


def test_math_reward_works_off_the_main_thread():
    # math-verify's own signal timeouts would raise ValueError here; ours are off
    results = []
    worker = threading.Thread(target=lambda: results.append(MATH(r"\boxed{0.5}", "1/2")))
    worker.start()
    worker.join()
    assert results == [1.0]


def test_math_reward_refuses_an_empty_ground_truth():
    with pytest.raises(ValueError, match="ground-truth answer is empty"):
        MATH(r"\boxed{1}", "  ")


@pytest.mark.parametrize(
    "text, want",
    [
        (r"\boxed{a{b{c}}d} tail", "a{b{c}}d"),
        (r"\boxed{1} \boxed{2}", "2"),
        (r"\boxed{\}} ", r"\}"),
        (r"\boxed{1} \boxed{unterminated", "1"),
        ("no box", None),
        (r"\boxed{ 5 }", "5"),
    ],
)
def test_last_boxed(text, want):
    assert last_boxed(text) == want


@pytest.mark.parametrize(
    "completion, want",
    [
        ("thinking...\nAnswer: 42", "42"),
        ("Answer: 1\nno wait\nAnswer:  17  \nthat's it", "17"),  # last marker, its own line
        ("Answer:\n\n  9\nmore", "9"),  # marker alone on its line: next non-empty line
        ("work\n  13  \n\n", "13"),  # no marker: last non-empty line
        ("Answer:", ""),
        ("", ""),
    ],
)
def test_final_answer(completion, want):
    assert final_answer(completion) == want


def test_exact_match_strips_but_is_otherwise_exact():
    assert EXACT("steps\nAnswer: 42 ", " 42\n") == 1.0
    assert EXACT("steps\nAnswer: 42.", "42") == 0.0
    assert EXACT("steps\nanswer: 42", "42") == 0.0  # marker is case-sensitive: last line used
    assert EXACT("steps\n42", "42") == 1.0


def test_registry_names():
    assert {"math", "exact_match"} <= set(REWARD_FUNCTIONS.names())
