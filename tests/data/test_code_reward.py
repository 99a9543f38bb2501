"""The code rewards (sparrow/data/code_reward.py): program extraction, test parsing,
output comparison, and correct, wrong, timing-out and crashing programs scored in the bwrap
sandbox, directly and through the parallel reward runner.
Run: `python -m pytest tests/data/test_code_reward.py -q`."""

from __future__ import annotations

import json

import pytest

from sparrow.config.load import ConfigError, load_config
from sparrow.data.code_reward import (
    CodeReward,
    extract_program,
    parse_tests,
    same_stdout,
    same_value,
)
from sparrow.data.reward_runner import RewardRunnerError, score_completions
from sparrow.data.rewards import REWARD_FUNCTIONS
from sparrow.data.sandbox import SandboxLimits, SandboxUnavailableError

FAST = CodeReward(SandboxLimits(time_limit_s=0.5, startup_allowance_s=1.0))
SUM_TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7", "0"]})
CALL_TESTS = json.dumps(
    {"inputs": [[1, 2], [2, 5], [0, 0]], "outputs": [[3], [7], [0]], "fn_name": "add"}
)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nIt reads two numbers."


def test_extract_program_takes_the_last_python_block_else_untagged_else_the_text():
    text = "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```\n```text\nno\n```"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("```\nprint(3)\n```") == "print(3)\n"
    assert extract_program("print(4)") == "print(4)"
    assert extract_program("```python\nprint(5)\n```\n```python\nprint(6)") == "print(5)\n"


def test_parse_tests_reads_taco_rows_and_refuses_bad_ones():
    tests = parse_tests(json.dumps({"inputs": [["a", "b"]], "outputs": [["c"]]}))
    assert tests.inputs == ("a\nb",) and tests.outputs == ("c",) and tests.fn_name is None
    assert parse_tests(CALL_TESTS).inputs[1] == [2, 5]
    for bad in (
        "not json",
        "[1]",
        '{"inputs": [], "outputs": []}',
        '{"inputs": ["1"], "outputs": []}',
        '{"inputs": [1], "outputs": [1], "fn_name": "a b"}',
        '{"inputs": [1], "outputs": [1], "time_limit_s": -1}',
    ):
        with pytest.raises(ValueError):
            parse_tests(bad)


def test_outputs_compare_by_whitespace_normalised_lines_and_values_by_json():
    assert same_stdout("1  2\n3\n\n", "1 2\n3")
    assert same_stdout("\n 1\t2 \n", "1 2")
    assert not same_stdout("1 2 3", "1 2\n3")
    assert not same_stdout("12", "1 2")
    assert same_value([1, 2.0000000001], [1, 2]) and same_value({"a": [1]}, {"a": [1]})
    assert not same_value(True, 1) and not same_value([1, 2], [1, 2, 3]) and not same_value("1", 1)


@pytest.mark.parametrize(
    "program, share",
    [
        ("a, b = map(int, input().split())\nprint(a + b)", 1.0),  # correct
        ("a, b = map(int, input().split())\nprint(a + b if a else 1)", 2 / 3),  # one test wrong
        ("print(0)", 1 / 3),  # right only by chance
        ("import sys\nsys.exit(3)", 0.0),  # exits non-zero
        ("raise RuntimeError('crash')", 0.0),  # crashes
        ("while True:\n    pass", 0.0),  # times out
        ("def broken(:\n", 0.0),  # does not compile
    ],
)
def test_stdin_programs_score_the_share_of_tests_passed(program, share):
    assert FAST(fenced(program), SUM_TESTS) == pytest.approx(share)


def test_a_program_that_prints_the_right_answer_then_crashes_fails():
    program = "a, b = map(int, input().split())\nprint(a + b, flush=True)\nraise SystemExit(1)"
    assert FAST(fenced(program), SUM_TESTS) == 0.0


def test_function_call_tests_use_the_entry_point_and_ignore_prints():
    assert (
        FAST(fenced("def add(a, b):\n    print('debug', a)\n    return a + b"), CALL_TESTS) == 1.0
    )
    assert (
        FAST(fenced("class Solution:\n    def add(self, a, b):\n        return a + b"), CALL_TESTS)
        == 1.0
    )
    assert FAST(fenced("def add(a, b):\n    return a * b"), CALL_TESTS) == pytest.approx(1 / 3)
    assert FAST(fenced("def plus(a, b):\n    return a + b"), CALL_TESTS) == 0.0
    # printing the expected value instead of returning it earns nothing
    assert FAST(fenced("def add(a, b):\n    print([a + b])"), CALL_TESTS) == 0.0


def test_code_all_is_one_only_when_every_test_passes():
    all_pass = CodeReward(FAST.limits, all_pass=True)
    assert all_pass(fenced("def add(a, b):\n    return a + b"), CALL_TESTS) == 1.0
    assert all_pass(fenced("def add(a, b):\n    return a * b"), CALL_TESTS) == 0.0
    assert {"code", "code_all"} <= set(REWARD_FUNCTIONS.names())
    assert REWARD_FUNCTIONS.get("code_all").all_pass


def test_a_row_time_limit_overrides_the_default():
    reward = CodeReward(SandboxLimits(time_limit_s=0.5, startup_allowance_s=0.3))
    slow = "import time\ntime.sleep(1.0)\nprint(3)"  # wall clock, not CPU time
    tests = {"inputs": ["1 2"], "outputs": ["3"]}
    assert reward(fenced(slow), json.dumps(tests)) == 0.0
    assert reward(fenced(slow), json.dumps({**tests, "time_limit_s": 2.0})) == 1.0


def test_the_runner_scores_code_in_parallel_workers():
    completions = [
        fenced("a, b = map(int, input().split())\nprint(a + b)"),
        fenced("print(0)"),
        fenced("raise SystemExit(2)"),
        "no code at all",
    ]
    batch = score_completions("code", completions, [SUM_TESTS] * 4, timeout_s=30.0, workers=2)
    assert batch.rewards == pytest.approx([1.0, 1 / 3, 0.0, 0.0])
    assert batch.errors == 0 and batch.timeouts == 0


def test_without_bwrap_the_code_reward_refuses_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # bwrap is found through PATH only
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        FAST(fenced("print(3)"), SUM_TESTS)
    with pytest.raises(RewardRunnerError, match="bwrap"):
        score_completions("code", ["print(3)"], [SUM_TESTS])
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        load_config(["data.reward=code"])
