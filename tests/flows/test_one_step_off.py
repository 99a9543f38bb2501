"""The one-step-off train flow (pipeline.max_staleness=1, docs/async.md): order, recorded
versions, both mismatches, and resume after a failure in each stage of a step.

Three steps of the embedded default at test size. The rollout of step n+1 starts once step
n's rewards are in, from update n-1's weights, before step n's dense_score; it is recorded in
step n+1. A chain of runs on one run id, each failed on purpose in the next stage of step 2
(with the rollout of step 3 in flight from dense_score on), then resumed to the end, must end
equal to the uninterrupted run: the same stage records, each once, the same samples in every
step, the same metrics and final weights.

Run: `python -m pytest tests/flows/test_one_step_off.py -q` (slow: several flow runs).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from safetensors.torch import load_file

from sparrow.data.rollouts import read_rollouts
from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.storage import query
from tests.flows.test_train_flow import STEP_STAGES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

PIPELINED = ("pipeline.steps=3", "pipeline.max_staleness=1")
TIMING = ("time/", "rollout/tokens_per_s")


def rows(workdir: Path, sql: str) -> list[dict]:
    return query(workdir, sql).as_dicts()


def stage_dir(workdir: Path, run_id: str, step: int, stage: str) -> Path:
    return workdir / "runs" / run_id / f"step-{step}" / stage


def metrics_of(workdir: Path) -> dict[tuple[int, str], float]:
    return {
        (r["step"], r["name"]): r["value"]
        for r in rows(workdir, "SELECT step, name, value FROM step_metrics")
        if not r["name"].startswith(TIMING)
    }


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory, flow_environment, small_overrides):
    flow_environment.start()
    workdir = tmp_path_factory.mktemp("pipelined") / "work"
    summary = train_flow(small_overrides(workdir, "p", *PIPELINED), show_table=False)
    return workdir, summary


def test_every_stage_once_and_each_rollout_from_the_version_before_last(pipelined):
    workdir, summary = pipelined
    assert summary["status"] == "finished"
    recorded = rows(workdir, "SELECT step, stage, count(*) AS n FROM stage_runs GROUP BY ALL")
    assert {(r["step"], r["stage"]) for r in recorded} == {
        (s, st) for s in (1, 2, 3) for st in STEP_STAGES
    } | {(2, "evaluate"), (3, "checkpoint")}
    assert {r["n"] for r in recorded} == {1}
    assert rollout_versions(workdir, "p") == ONE_STEP_OFF_VERSIONS


# per step: (versions of its samples, launch.json's version, started in flight); step 1 has no
# step before it to start it, steps 2 and 3 were started in flight from the version before last
ONE_STEP_OFF_VERSIONS = [(1, {0}, 0, False), (2, {0}, 0, True), (3, {1}, 1, True)]


def rollout_versions(workdir: Path, run_id: str) -> list[tuple[int, set, int, bool]]:
    found = []
    for step in (1, 2, 3):
        folder = stage_dir(workdir, run_id, step, "rollout")
        records = read_rollouts(folder / "rollouts.parquet")
        launch = json.loads((folder / "launch.json").read_text())
        versions = {r.policy_version for r in records}
        found.append((step, versions, launch["policy_version"], launch["in_flight"]))
    return found


def test_the_next_rollout_starts_after_the_rewards_and_before_the_scoring(pipelined):
    workdir, _ = pipelined
    times = {
        (r["step"], r["stage"]): (r["started_at"], r["finished_at"])
        for r in rows(workdir, "SELECT step, stage, started_at, finished_at FROM stage_runs")
    }
    for step in (1, 2):
        launch = json.loads(
            (stage_dir(workdir, "p", step + 1, "rollout") / "launch.json").read_text()
        )
        launched = datetime.fromisoformat(launch["launched_at"])
        assert times[(step, "reward")][1] <= launched <= times[(step, "dense_score")][0]
        # collected (recorded) once step n's update and sync are done, as step n+1 begins
        assert times[(step + 1, "rollout")][1] >= times[(step, "sync_weights")][1]


def test_stale_and_sparse_mismatch_stand_apart_in_duckdb(pipelined):
    workdir, _ = pipelined
    versions = rows(
        workdir,
        "SELECT step, min(policy_version) AS lo, max(policy_version) AS hi, "
        "count(*) FILTER (WHERE sparse_acceptance != acceptance) AS differ, count(*) AS n "
        "FROM token_mismatch GROUP BY step ORDER BY step",
    )
    assert [(r["step"], r["lo"], r["hi"]) for r in versions] == [(1, 0, 0), (2, 0, 0), (3, 1, 1)]
    # step 1 is fresh: both acceptances are one number; a stale step's differ on some tokens
    assert versions[0]["differ"] == 0 and versions[1]["differ"] > 0 and versions[2]["differ"] > 0
    metrics = metrics_of(workdir)
    assert [metrics[(s, "dense/stale_samples")] for s in (1, 2, 3)] == [0, 4, 4]
    assert [metrics[(s, "mismatch/stale_frac")] for s in (1, 2, 3)] == [0, 1, 1]
    samples = rows(workdir, "SELECT step, policy_version FROM sample_stats ORDER BY step")
    assert [(r["step"], r["policy_version"]) for r in samples] == [
        (s, v) for s, v in ((1, 0), (2, 0), (3, 1)) for _ in range(4)
    ]


def test_a_failure_in_each_stage_of_step_2_resumes_to_the_same_end(
    pipelined, tmp_path, small_overrides
):
    reference, _ = pipelined
    workdir = tmp_path / "work"
    for stage in (*STEP_STAGES, "evaluate"):
        with pytest.raises(StageFailedOnPurpose, match=f"{stage}.*step 2"):
            train_flow(
                small_overrides(workdir, "p", *PIPELINED, f"pipeline.fail_at={stage}@2"),
                show_table=False,
            )
    summary = train_flow(small_overrides(workdir, "p", *PIPELINED), show_table=False)
    assert summary["status"] == "finished"
    assert_same_end(workdir, reference, "p")


def assert_same_end(workdir: Path, reference: Path, run_id: str) -> None:
    """The resumed run of 3 steps ended as the uninterrupted one: every stage recorded once,
    the samples of every step (versions included), the metrics less wall-clock ones, and the
    final weights bit for bit."""
    stages = "SELECT step, stage, count(*) AS n FROM stage_runs GROUP BY ALL ORDER BY ALL"
    assert rows(workdir, stages) == rows(reference, stages)
    for step in (1, 2, 3):
        path = stage_dir(Path(), run_id, step, "rollout") / "rollouts.parquet"
        assert read_rollouts(workdir / path) == read_rollouts(reference / path)
    assert metrics_of(workdir) == metrics_of(reference)
    final = stage_dir(Path(), run_id, 3, "policy_update") / "model.safetensors"
    want, got = load_file(str(reference / final)), load_file(str(workdir / final))
    assert want.keys() == got.keys() and all(bool((want[k] == got[k]).all()) for k in want)
