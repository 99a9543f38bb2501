"""Fault injection: `sparrow train` killed with SIGKILL inside every stage of step 2, resumed
each time, ends exactly where an uninterrupted run ends.

    python -m pytest tests/flows/test_kill_matrix.py -q        (a few minutes)

One chain of processes on one run id: the first is killed in step 2's rollout (its files
written, not yet renamed or recorded: pipeline.kill_at), the next resumes and is killed in the
reward stage, and so on through every stage of step 2; the last resumes to the end. Against a
run of the same configuration that was never interrupted: no stage recorded twice or lost, the
same step metrics (wall-clock ones aside), the same final weights, no scratch folder left, and
the run marked finished. The uninterrupted run is the session's base run (tests/conftest.py);
the chain's processes report to the session's Prefect test API and join its Ray: a process
killed in a stage leaves its flow run unfinished there and its actor to Ray, which stops an
actor whose owner died.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

STEP2_STAGES = (
    "rollout",
    "reward",
    "dense_score",
    "aggregate_mismatch",
    "reoptimize_schedule",
    "policy_update",
    "sync_weights",
    "checkpoint",
)
# metrics that measure wall-clock time or memory, and so differ between two runs of one input
VARYING = ("time/", "rollout/tokens_per_s")


def _train(workdir: Path, run_id: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sparrow.cli.main",
            "train",
            f"pipeline.workdir={workdir}",
            f"pipeline.run_id={run_id}",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _rows(workdir: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(workdir / "sparrow.duckdb"), read_only=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.slow
def test_kill_in_every_stage_of_step_2_then_resume_ends_equal(tmp_path, flow_environment, base_run):
    env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")
    # the chain's last process skips the end-of-run report (the base run writes one)
    args = (*base_run.args, f"ray.address={ray_address}", "pipeline.report=false")
    # the uninterrupted run: the session's base run of the same arguments (tests/conftest.py)
    reference, chained, run_id = base_run.workdir, tmp_path / "chained", base_run.run_id
    assert base_run.done.returncode == 0, base_run.done.stderr[-3000:]
    for stage in STEP2_STAGES:
        killed = _train(chained, run_id, env, *args, f"pipeline.kill_at={stage}@2")
        assert killed.returncode == -9, (stage, killed.returncode, killed.stderr[-3000:])
        # the killed stage wrote its scratch folder and recorded nothing
        assert not _rows(chained, f"SELECT 1 FROM stage_runs WHERE step = 2 AND stage = '{stage}'")
    done = _train(chained, run_id, env, *args)
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
    final = f"runs/{run_id}/step-2/policy_update/model.safetensors"
    want_w, got_w = load_file(str(reference / final)), load_file(str(chained / final))
    assert want_w.keys() == got_w.keys()
    assert all(bool((want_w[k] == got_w[k]).all()) for k in want_w)
    leftovers = [p for p in (chained / "runs").rglob(".*tmp-*")]
    assert leftovers == []
