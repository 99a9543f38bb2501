"""data.reward as a registry name, module:function or path/to/file.py:function
(sparrow/data/reward_spec.py), through the batch runner's worker processes, and the
errors that name what is wrong. Run: `python -m pytest tests/data/test_reward_spec.py -q`."""

from __future__ import annotations

import textwrap

import pytest

from sparrow.config import load_config
from sparrow.config.load import ConfigError
from sparrow.data.reward_runner import RewardRunnerError, score_completions
from sparrow.data.reward_spec import RewardSpecError, load_reward, normalise_spec
from sparrow.data.rewards import REWARD_FUNCTIONS

USER_REWARDS = '''
def length_match(completion, answer):
    """1 when the completion is as long as the answer says."""
    return 1.0 if len(completion) == int(answer) else 0.0


def picky(completion, answer):
    if completion.startswith("bad"):
        raise ValueError(f"cannot score {completion!r}")
    return 0.5


def two_args_too_many(completion, answer, extra):
    return 0.0


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "user_rewards" / "scoring.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(USER_REWARDS))
    return path


def test_a_registry_name_is_the_registered_function():
    assert load_reward("exact_match") is REWARD_FUNCTIONS.get("exact_match")


def test_a_file_function_loads_and_scores_in_the_workers(reward_file):
    function = load_reward(f"{reward_file}:length_match")
    assert function("abc", "3") == 1.0 and function("ab", "3") == 0.0
    batch = score_completions(
        f"{reward_file}:length_match",
        ["abc", "ab", "abcd"],
        ["3", "3", "4"],
        timeout_s=30.0,
        workers=2,
    )
    assert batch.rewards == [1.0, 0.0, 1.0] and batch.errors == 0


def test_a_relative_file_path_is_made_absolute(reward_file, monkeypatch):
    monkeypatch.chdir(reward_file.parent.parent)
    spec = "user_rewards/scoring.py:picky"
    assert normalise_spec(spec) == f"{reward_file}:picky"
    assert load_reward(spec)("good", "") == 0.5


def test_a_module_function_loads(reward_file, monkeypatch):
    monkeypatch.syspath_prepend(str(reward_file.parent))
    function = load_reward("scoring:length_match")
    assert function("abcd", "4") == 1.0
    batch = score_completions(
        "scoring:length_match", ["x", "xy"], ["1", "1"], timeout_s=30.0, workers=1
    )
    assert batch.rewards == [1.0, 0.0]


def test_a_raising_user_function_scores_zero_with_its_traceback(reward_file):
    batch = score_completions(
        f"{reward_file}:picky",
        ["good", "bad one", "bad two"],
        ["", "", ""],
        timeout_s=30.0,
        workers=1,
    )
    assert batch.rewards == [0.5, 0.0, 0.0] and batch.errors == 2
    assert batch.first_error == "sample 1: ValueError: cannot score 'bad one'"
    assert "Traceback" in batch.first_traceback and "scoring.py" in batch.first_traceback
    assert "in picky" in batch.first_traceback


@pytest.mark.parametrize(
    "suffix, message",
    [
        ("nope.py:score", "no file"),
        ("scoring.py:missing", "has no 'missing'"),
        ("scoring.py:NOT_A_FUNCTION", "is a int, not a function"),
        ("scoring.py:two_args_too_many", r"must take \(completion: str, answer: str\)"),
        ("scoring.py:", "not module:function"),
    ],
)
def test_a_bad_file_spec_names_what_is_wrong(reward_file, suffix, message):
    spec = f"{reward_file.parent}/{suffix}"
    with pytest.raises(RewardSpecError, match=message):
        load_reward(spec)


def test_bad_names_name_the_choices():
    with pytest.raises(
        RewardSpecError, match=r"valid: code, code_all, exact_match, math.*module:function"
    ):
        load_reward("exakt_match")
    with pytest.raises(RewardSpecError, match=r"cannot import 'no_such_module_here'"):
        load_reward("no_such_module_here:score")
    with pytest.raises(RewardRunnerError, match="cannot import"):
        score_completions("no_such_module_here:score", ["a"], ["a"])


def test_a_file_that_raises_on_load_is_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_dependency_xyz\ndef score(c, a):\n    return 1.0\n")
    with pytest.raises(RewardSpecError, match=r"loading .*broken\.py raised ModuleNotFoundError"):
        load_reward(f"{broken}:score")


def test_the_config_checks_the_spec(reward_file):
    cfg = load_config([f"data.reward={reward_file}:length_match"])
    assert cfg.data.reward == f"{reward_file}:length_match"
    with pytest.raises(ConfigError, match=r"'data.reward'.*has no 'nope'"):
        load_config([f"data.reward={reward_file}:nope"])
    with pytest.raises(ConfigError, match=r"'data.reward'.*valid: code, code_all, exact_match"):
        load_config(["data.reward=exakt_match"])
    with pytest.raises(ConfigError, match="data.reward_max_error_share"):
        load_config(["data.reward_max_error_share=1.5"])
