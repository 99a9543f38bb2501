"""Fault injection on the one-step-off flow (pipeline.max_staleness=1, docs/async.md):
`sparrow train` killed with SIGKILL inside every stage of step 2, resumed each time, ends
exactly where an uninterrupted run of the same configuration ends.

    python -m pytest tests/flows/test_kill_matrix_one_step_off.py -q     (several minutes)

Three steps, so step 2 starts the rollout of step 3: from dense_score on, each killed process
dies with that rollout in flight, recorded nowhere. One chain of processes on one run id, as
in tests/flows/test_kill_matrix.py: killed in step 2's rollout (its files written, not yet
renamed or recorded), then in its reward stage, and so on; the last resumes to the end.
Against the uninterrupted run: no stage recorded twice or lost, the same samples (policy
versions included) in every step, the same step metrics (wall-clock ones aside), the same
final weights, no scratch folder left, the run finished.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from sparrow.data.rollouts import read_rollouts
from tests.conftest import BASE_RUN_ARGS
from tests.flows.test_kill_matrix import VARYING, _rows, _train
from tests.flows.test_train_flow import STEP_STAGES as STEP2_STAGES


@pytest.mark.slow
def test_kill_in_every_stage_of_step_2_then_resume_ends_equal(tmp_path, flow_environment):
    env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")
    args = (
        *BASE_RUN_ARGS,
        "pipeline.steps=3",
        "pipeline.max_staleness=1",
        f"ray.address={ray_address}",
        "pipeline.report=false",
    )
    reference, chained, run_id = tmp_path / "reference", tmp_path / "chained", "k"
    done = _train(reference, run_id, env, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in STEP2_STAGES:
        killed = _train(chained, run_id, env, *args, f"pipeline.kill_at={stage}@2")
        assert killed.returncode == -9, (stage, killed.returncode, killed.stderr[-3000:])
        assert not _rows(chained, f"SELECT 1 FROM stage_runs WHERE step = 2 AND stage = '{stage}'")
    done = _train(chained, run_id, env, *args)
    assert done.returncode == 0, done.stderr[-3000:]

    stages = "SELECT step, stage, count(*) FROM stage_runs GROUP BY ALL ORDER BY ALL"
    assert _rows(chained, stages) == _rows(reference, stages)
    assert all(count == 1 for _, _, count in _rows(chained, stages))
    for step, version in ((1, 0), (2, 0), (3, 1)):
        path = Path("runs") / run_id / f"step-{step}" / "rollout" / "rollouts.parquet"
        got = read_rollouts(chained / path)
        assert got == read_rollouts(reference / path)
        assert {r.policy_version for r in got} == {version}
    metrics = "SELECT step, name, value FROM step_metrics ORDER BY ALL"
    want = [r for r in _rows(reference, metrics) if not r[1].startswith(VARYING)]
    assert [r for r in _rows(chained, metrics) if not r[1].startswith(VARYING)] == want
    assert _rows(chained, "SELECT status FROM runs") == [("finished",)]
    final = f"runs/{run_id}/step-3/policy_update/model.safetensors"
    want_w, got_w = load_file(str(reference / final)), load_file(str(chained / final))
    assert want_w.keys() == got_w.keys()
    assert all(bool((want_w[k] == got_w[k]).all()) for k in want_w)
    assert [p for p in (chained / "runs").rglob(".*tmp-*")] == []
