"""The embedded default learns: `sparrow train`'s own settings (the tiny model, 8 prompts x 8
samples at temperature 1, algo.lr 3e-4) raise the reward within 3 steps, with nonzero GRPO
advantages and gradients at every step (docs/pipeline.md, "The embedded default").

Run: `python -m pytest tests/flows/test_train_learns.py -q` (about a minute on 2 cores).
"""

from __future__ import annotations

import pytest

from sparrow.flows.train import train_flow
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

STEPS = (1, 2, 3)


def test_default_run_reward_rises_with_nonzero_gradients(tmp_path):
    workdir = tmp_path / "work"
    # the defaults but 3 steps, and a cutoff that only stops a sample that never ends (and no
    # end-of-run report, which changes nothing the test reads)
    summary = train_flow(
        [
            f"pipeline.workdir={workdir}",
            "pipeline.run_id=learn",
            "pipeline.steps=3",
            "rollout.max_new_tokens=128",
            "pipeline.report=false",
        ],
        show_table=False,
    )
    assert summary["status"] == "finished"
    metrics = {
        (r["step"], r["name"]): r["value"]
        for r in query(
            workdir, "SELECT step, name, value FROM step_metrics WHERE run_id = 'learn'"
        ).as_dicts()
    }
    rewards = [metrics[(s, "reward/mean")] for s in STEPS]
    # the model starts partly right (dense sampled accuracy 0.45) ...
    assert 0.2 <= rewards[0] <= 0.6, rewards
    # ... its samples differ, so every step has advantages and a gradient ...
    for step in STEPS:
        assert metrics[(step, "actor/advantage_abs_mean")] > 0.1, step
        assert metrics[(step, "actor/grad_norm")] > 0.01, step
    # ... and the reward rises (measured 0.438, 0.469, 0.922)
    assert rewards[-1] > rewards[0] + 0.2, rewards
