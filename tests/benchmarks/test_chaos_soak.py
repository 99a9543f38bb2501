"""The chaos soak, briefly: 3 steps of the embedded default at test size, SIGKILL to the flow,
then to a Ray rollout actor, then to Prefect's server, resuming each time; every table equals
the uninterrupted run's, the final weights too, and nothing is left running or half-written.

Run: `python -m pytest tests/benchmarks/test_chaos_soak.py -q` (slow: 4-8 minutes on 2 busy
CPU cores; benchmarks/chaos_soak.py runs the long one, docs/pipeline.md has its figures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_three_ways_and_resumed_ends_equal(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "chaos_soak.py"),
            "--steps=3",  # room for three kills before the run ends
            "--kills=3",
            "--targets=flow,actor,prefect",
            "--seed=1",
            "--hang-s=60",
            f"--root={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["ok"], done.stdout[-4000:]
    assert [k["target"] for k in result["kills"]] == ["flow", "actor", "prefect"]
    # a killed Prefect server ends the command at once with its one line (no client retries)
    assert result["kills"][2]["outcome"] == "flow exited 1", result["kills"]
    assert all(t["equal"] and t["rows"] > 0 for t in result["tables"].values())
    assert result["weights_equal"] and result["stages_once"]
    assert result["scratch"] == [] and result["left"] == {}
    assert result["failed_unkilled"] == 0  # a killed actor is replaced, the flow goes on
