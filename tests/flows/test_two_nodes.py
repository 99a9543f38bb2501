"""The two-node test (tests/flows/two_nodes_case.py) in a pytest process of its own.

    python -m pytest tests/flows/test_two_nodes.py -q        (slow: about 3 minutes)

Why a process of its own: in a process that was connected to another Ray earlier (the local
Ray that other tests of the same xdist worker start and stop), the flow joins the two nodes
but its first actors are cancelled before they run ("all references to the actor were
removed"; Ray 2.60). `sparrow train` is a process of its own per run, so users do not meet
it; the test is about two nodes, not about reconnecting one process to a second cluster.
sparrow/runtime/rollout/actors.py's start_ray refuses the other half of it: a process still
connected to one cluster asked to join another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASE = Path(__file__).with_name("two_nodes_case.py")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_two_nodes_lose_the_second_nodes_actors_and_end_equal(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASE)]
        + ["--basetemp", str(tmp_path / "case")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-5000:]
