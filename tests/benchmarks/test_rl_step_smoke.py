"""benchmarks/rl_step.py --smoke: the whole-step benchmark's code on CPU with the tiny model.

    python -m pytest tests/benchmarks/test_rl_step_smoke.py -q     (about a minute)

Its arms' processes report to the session's Prefect test API and join its Ray
(tests/conftest.py, FlowEnvironment) instead of starting their own.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_reports_every_case_key(run_flow_smoke, tmp_path):
    out = run_flow_smoke("rl_step.py", 600)
    payload = json.loads(out.read_text())
    (case,) = payload["cases"]
    for key in (
        "new_tokens",
        "batch",
        "rollout_speedup",
        "step_speedup",
        "mfu_score",
        "mfu_update",
        "peak_memory_gib",
    ):
        assert key in case
    assert case["new_tokens"] == 24 and case["batch"] == 4
    for arm in ("dense", "sparse"):
        stats = case["arms"][arm]
        # eos off: every sample runs to the cutoff, in every timed step
        assert stats["tokens"] == 4 * 24
        assert all(stats["stage_s"][s] > 0 for s in ("rollout", "dense_score", "policy_update"))
        # the hand-over's two parts, each within the rollout stage
        assert (
            0
            <= stats["rollout_release_s"] + stats["rollout_engine_wake_s"]
            <= stats["stage_s"]["rollout"]
        )
        # a CPU engine has no CUDA graphs: nothing captured, nothing kept
        assert stats["rollout_capture_s"] == 0 and stats["rollout_graphs_kept"] == 0
    assert case["rollout_speedup"] > 0 and case["step_speedup"] > 0
    # the runs' folders went (the metrics live in DuckDB), the done markers stayed
    assert not (tmp_path / "work" / "dense-24" / "runs").exists()
    assert (tmp_path / "work" / "dense-24" / "done.json").exists()
