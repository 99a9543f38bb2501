"""The one-step-off train flow with a trainer group (pipeline.max_staleness=1,
trainer.num_workers=2 on gloo, two engines, rollout.placement=separate: on CPU each rank and
engine is a process with its share of the CPUs; docs/async.md).

Three steps: the rollouts come from policy versions 0, 0 and 1 as in one process, the weights
reach the engines by the group's broadcast, and the stale samples of steps 2 and 3 are scored
against their own version (on rank 0). A run failed in step 2's sync_weights,
with the rollout of step 3 in flight, is resumed: its engines start from version 2, so the
rollout of step 3 is generated again only after they load version 1's folder. The resumed
run ends equal to the uninterrupted one (tests/flows/test_one_step_off.py's comparison).

Marked slow (Ray actors for 2 ranks and 2 engines, three flow runs).
Run: `python -m pytest tests/flows/test_one_step_off_group.py -q`.
"""

from __future__ import annotations

import json

import pytest

from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from tests.flows.test_one_step_off import (
    ONE_STEP_OFF_VERSIONS,
    PIPELINED,
    assert_same_end,
    metrics_of,
    rollout_versions,
    stage_dir,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

GROUP = (
    *PIPELINED,
    "trainer.num_workers=2",
    "rollout.num_actors=2",
    "rollout.placement=separate",
    # the CPU suite's time: no evaluation, shorter samples, no controller event in 3 steps
    "pipeline.eval_every=0",
    "rollout.max_new_tokens=12",
    "control.patience=4",
)


def test_a_group_one_step_off_from_the_right_versions_and_resumed_to_the_same_end(
    small_overrides, tmp_path
):
    reference = tmp_path / "reference"
    summary = train_flow(small_overrides(reference, "g", *GROUP), show_table=False)
    assert summary["status"] == "finished"
    assert rollout_versions(reference, "g") == ONE_STEP_OFF_VERSIONS
    for step in (1, 2, 3):
        synced = json.loads(
            (stage_dir(reference, "g", step, "sync_weights") / "synced.json").read_text()
        )
        assert synced["modes"] == ["gloo", "gloo"]
    # steps 2 and 3 trained on stale samples, scored again against their version on rank 0
    stale = metrics_of(reference)
    assert [stale[(s, "dense/stale_samples")] for s in (1, 2, 3)] == [0, 4, 4]

    workdir = tmp_path / "work"
    with pytest.raises(StageFailedOnPurpose, match="sync_weights.*step 2"):
        train_flow(
            small_overrides(workdir, "g", *GROUP, "pipeline.fail_at=sync_weights@2"),
            show_table=False,
        )
    summary = train_flow(small_overrides(workdir, "g", *GROUP), show_table=False)
    assert summary["resumed"] and summary["status"] == "finished"
    assert_same_end(workdir, reference, "g")
