"""benchmarks/code_reward.py --smoke: the code reward benchmark's code, in seconds.

python -m pytest tests/benchmarks/test_code_reward_smoke.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_reports_overhead_and_throughput(tmp_path):
    out = tmp_path / "code_reward.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "code_reward.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(out.read_text())
    overhead = payload["overhead"]
    assert (
        overhead["runs"] == 3 and overhead["sandboxed_ms"] > 0 and overhead["plain_python_ms"] > 0
    )
    difference = overhead["sandboxed_ms"] - overhead["plain_python_ms"]
    assert abs(overhead["overhead_ms"] - difference) <= 0.11
    (row,) = payload["throughput"]
    assert row["workers"] == 2 and row["programs"] == 10 and row["sandboxed_runs"] == 31
    assert row["programs_per_s"] > 0
    assert payload["facts"]["bwrap"].startswith("bubblewrap")
