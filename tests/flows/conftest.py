"""Fixtures of the flow tests: test-size overrides and test reward functions, on top of the
session's one Prefect test API and one local Ray (FlowEnvironment, tests/conftest.py).

    def test_x(flow_env, small_overrides, tmp_path):     # Prefect harness + Ray are up
        train_flow(small_overrides(tmp_path / "work", "r1"))

The test rewards are registered while this folder's tests run (the reward runner's workers
import them from this module by name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparrow.flows.prefect_env import quiet_prefect

quiet_prefect()


def char_code_reward(completion: str, answer: str) -> float:
    """A reward that differs between any two different completions, so GRPO advantages (and
    the update) are not 0 even when every sample is wrong or right alike."""
    return (sum(map(ord, completion)) % 97) / 96


def always_raises(completion: str, answer: str) -> float:
    raise RuntimeError("this reward function always fails")


TEST_REWARDS = {"test_char_code": char_code_reward, "test_always_raises": always_raises}


def _small_overrides(workdir: Path, run_id: str, *extra: str) -> list[str]:
    """Two steps of the embedded default at test size: 2 prompts x 2 samples, 24 new tokens,
    evaluated after step 2. Sampling is hot (temperature 2) because the embedded model is
    nearly certain at 1: samples of one prompt must differ for the update to do anything.
    At temperature 2 some bins fall below target; control.patience=3 keeps the controller
    from raising them within the 2 steps, so the schedule stays tiny-0.86 version 1
    (tests/stages/test_reoptimize.py covers raising). A bin counts from 8 tokens of 2
    trajectories (calibrate.min_bin_*; the default floor, 500 of 8, is for real batches and
    would leave every bin of 4 samples x 24 tokens out). No end-of-run report: the session's
    base run writes one (tests/cli/test_train_cli.py checks it)."""
    return [
        f"pipeline.workdir={workdir}",
        f"pipeline.run_id={run_id}",
        "pipeline.steps=2",
        "data.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=24",
        "rollout.temperature=2.0",
        "data.reward=test_char_code",
        "data.eval=builtin:synthetic",
        "pipeline.eval_every=2",
        "control.patience=3",
        "calibrate.min_bin_tokens=8",
        "calibrate.min_bin_samples=2",
        "pipeline.report=false",
        *extra,
    ]


@pytest.fixture(scope="session")
def small_overrides():
    """small_overrides(workdir, run_id, *extra) -> the override list of a test-size run."""
    return _small_overrides


@pytest.fixture(scope="session")
def reward_fn():
    return char_code_reward


def _register_test_rewards() -> None:
    from sparrow.data.rewards import REWARD_FUNCTIONS

    REWARD_FUNCTIONS._entries.update(TEST_REWARDS)


@pytest.fixture(scope="session")
def flow_environment(flow_environment):
    """The session's Prefect test API and Ray (tests/conftest.py), with TEST_REWARDS
    registered: call .start() in module-scoped fixtures before running a flow."""
    _register_test_rewards()
    return flow_environment


# The rewards leave the registry whenever the next test of this process is outside this folder
# (pytest_runtest_teardown below); with pytest-xdist a worker's tests of this folder come
# between others', so they are registered again before each module's fixtures and each test.
@pytest.fixture(scope="module", autouse=True)
def _test_rewards_for_the_module():
    _register_test_rewards()


@pytest.fixture(autouse=True)
def _test_rewards_for_the_test():
    _register_test_rewards()


@pytest.fixture
def flow_env(flow_environment):
    flow_environment.start()


def pytest_runtest_teardown(item, nextitem):
    """The test rewards leave the registry with this folder's last test (later tests list the
    registered names)."""
    if nextitem is None or Path(nextitem.path).parent != Path(__file__).parent:
        from sparrow.data.rewards import REWARD_FUNCTIONS

        for name in TEST_REWARDS:
            REWARD_FUNCTIONS._entries.pop(name, None)
