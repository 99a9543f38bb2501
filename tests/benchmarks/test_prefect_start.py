"""benchmarks/prefect_start.py runs both ways and reports them (its figures are
docs/pipeline.md's); a process of its own, since a server starts only where Prefect was never
imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reports_both_ways_and_leaves_the_callers_cache_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["SPARROW_CACHE_DIR"] = str(tmp_path / "users-cache")
    out = tmp_path / "p.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "prefect_start.py"), "--starts", "1"]
        + ["--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["made_s"]) == len(result["copied_s"]) == 1
    assert result["ratio"] == result["made_median_s"] / result["copied_median_s"] > 0
    assert all(s > 0 for s in result["made_cpu_s"] + result["copied_cpu_s"])
    assert not (tmp_path / "users-cache").exists()
