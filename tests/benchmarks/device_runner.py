"""Run a benchmark script as the device machine would: without the orchestration packages
(omegaconf, prefect, ray, mlflow, duckdb), which the GPU image lacks. A None in sys.modules
makes `import x` fail and importlib.util.find_spec(x) say "absent"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("omegaconf", "prefect", "ray", "mlflow", "duckdb")
RUNNER = f"""
import runpy, sys
sys.modules.update(dict.fromkeys({BLOCKED!r}))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_benchmark(script: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """benchmarks/<script> with args in a fresh interpreter that cannot import BLOCKED."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
