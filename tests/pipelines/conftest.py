"""Fixtures of the flow tests: one Prefect test API and one local Ray for the whole session.

    def test_x(flow_env, small_overrides, tmp_path):     # Prefect harness + Ray are up
        train_flow(small_overrides(tmp_path / "work", "r1"))

Starting them costs ~30 s on a 2-core machine, so every flow test shares them; the flow
leaves a Ray it did not start running. Test reward functions are registered for the session
(the reward runner's workers import them from this module by name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.prefect_env import quiet_prefect

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
    evaluated after step 2."""
    return [f"pipeline.workdir={workdir}", f"pipeline.run_id={run_id}", "pipeline.steps=2",
            "data.prompts_per_step=2", "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=24", "data.reward=test_char_code",
            "data.eval=builtin:synthetic", "pipeline.eval_every=2", *extra]


@pytest.fixture(scope="session")
def small_overrides():
    """small_overrides(workdir, run_id, *extra) -> the override list of a test-size run."""
    return _small_overrides


@pytest.fixture(scope="session")
def reward_fn():
    return char_code_reward


@pytest.fixture(scope="session")
def flow_env():
    from prefect.testing.utilities import prefect_test_harness

    from sparrow_core.data.rewards import REWARD_FUNCTIONS
    from tasks.rollout_actors import start_ray

    for name, function in TEST_REWARDS.items():
        REWARD_FUNCTIONS._entries[name] = function
    started = start_ray("")
    try:
        with prefect_test_harness(server_startup_timeout=180):
            yield
    finally:
        for name in TEST_REWARDS:
            REWARD_FUNCTIONS._entries.pop(name, None)
        if started:
            import ray

            ray.shutdown()
