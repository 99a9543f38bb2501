"""run_flow_smoke: a benchmark script's --smoke run whose processes report to the session's
Prefect test API and join its Ray (tests/conftest.py, FlowEnvironment)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_flow_smoke(tmp_path, flow_environment):
    """run_flow_smoke("rl_step.py", timeout_s) -> the path of its JSON output, after a run
    that must exit 0 (its stderr's tail in the failure message otherwise)."""

    def run(script: str, timeout_s: int) -> Path:
        out = tmp_path / f"{Path(script).stem}.json"
        env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), "--smoke"]
            + ["--workdir", str(tmp_path / "work"), "--out", str(out)]
            + ["--set", f"ray.address={ray_address}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return out

    return run
