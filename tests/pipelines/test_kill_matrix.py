"""Fault injection: `sparrow train` killed with SIGKILL inside every stage of step 2, resumed
each time, ends exactly where an uninterrupted run ends.

    python -m pytest tests/pipelines/test_kill_matrix.py -q        (a few minutes)

One chain of processes on one run id: the first is killed in step 2's rollout (its files
written, not yet renamed or recorded: pipeline.kill_at), the next resumes and is killed in the
reward stage, and so on through every stage of step 2; the last resumes to the end. Against a
run of the same configuration that was never interrupted: no stage recorded twice or lost, the
same step metrics (wall-clock ones aside), the same final weights, no scratch folder left, and
the run marked finished. The processes report to the folder's Prefect test API and join its
Ray (tests/pipelines/conftest.py): a process killed in a stage leaves the flow run unfinished
there and its actor to Ray, which stops an actor whose owner died.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

STEP2_STAGES = ("rollout", "reward", "dense_score", "aggregate_mismatch", "reoptimize_schedule",
                "policy_update", "sync_weights", "checkpoint")
# metrics that measure wall-clock time or memory, and so differ between two runs of one input
VARYING = ("time/", "rollout/tokens_per_s")


def _train(workdir: Path, run_id: str, env: dict, ray_address: str,
           *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparrow_cli.main", "train", f"ray.address={ray_address}",
         f"pipeline.workdir={workdir}",
         f"pipeline.run_id={run_id}", "pipeline.steps=2", "data.prompts_per_step=2",
         "rollout.samples_per_prompt=2", "rollout.max_new_tokens=16", "rollout.temperature=2.0",
         "pipeline.keep_checkpoints=0", *extra],
        env=env, capture_output=True, text=True, timeout=600)


def _rows(workdir: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(workdir / "sparrow.duckdb"), read_only=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.slow
def test_kill_in_every_stage_of_step_2_then_resume_ends_equal(tmp_path, flow_environment):
    env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")
    reference, chained = tmp_path / "reference", tmp_path / "chained"
    done = _train(reference, "k", env, ray_address)
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in STEP2_STAGES:
        killed = _train(chained, "k", env, ray_address, f"pipeline.kill_at={stage}@2")
        assert killed.returncode == -9, (stage, killed.returncode, killed.stderr[-3000:])
        # the killed stage wrote its scratch folder and recorded nothing
        assert not _rows(chained, f"SELECT 1 FROM stage_runs WHERE step = 2 AND stage = '{stage}'")
    done = _train(chained, "k", env, ray_address)
    assert done.returncode == 0, done.stderr[-3000:]

    stages = "SELECT step, stage, count(*) FROM stage_runs GROUP BY ALL ORDER BY ALL"
    assert _rows(chained, stages) == _rows(reference, stages)
    assert all(count == 1 for _, _, count in _rows(chained, stages))
    metrics = "SELECT step, name, value FROM step_metrics ORDER BY ALL"
    want = [r for r in _rows(reference, metrics) if not r[1].startswith(VARYING)]
    got = [r for r in _rows(chained, metrics) if not r[1].startswith(VARYING)]
    assert got == want
    for table in ("bin_stats", "schedules"):
        count = f"SELECT count(*) FROM {table}"
        assert _rows(chained, count) == _rows(reference, count)
    assert _rows(chained, "SELECT status FROM runs") == [("finished",)]
    final = "runs/k/step-2/policy_update/model.safetensors"
    want_w, got_w = load_file(str(reference / final)), load_file(str(chained / final))
    assert want_w.keys() == got_w.keys()
    assert all(bool((want_w[k] == got_w[k]).all()) for k in want_w)
    leftovers = [p for p in (chained / "runs").rglob(".*tmp-*")]
    assert leftovers == []
