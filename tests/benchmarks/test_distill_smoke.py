"""benchmarks/distill.py --smoke: the DistillSparse measurement on CPU with the tiny model,
in a process where Ray, Prefect, MLflow, DuckDB and OmegaConf cannot be imported (the GPU
image has none of them).

    python -m pytest tests/benchmarks/test_distill_smoke.py -q     (a minute or two)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("omegaconf", "prefect", "ray", "mlflow", "duckdb")
# a None in sys.modules makes `import x` fail and importlib.util.find_spec(x) say "absent"
RUNNER = f"""
import runpy, sys
sys.modules.update(dict.fromkeys({BLOCKED!r}))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

pytestmark = pytest.mark.slow


def test_smoke_reports_p5_before_after_and_timings(tmp_path):
    out, plot = tmp_path / "distill.json", tmp_path / "distill.png"
    done = subprocess.run([sys.executable, "-c", RUNNER, str(ROOT / "benchmarks" / "distill.py"),
                           "--smoke", "--out", str(out), "--plot", str(plot)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["steps"]) == 2 and plot.stat().st_size > 0
    before, after = report["before"], report["after"]
    # a fresh LoRA is the base: the same acceptance with and without it
    assert before["min_bin_p5_lora"] == pytest.approx(before["min_bin_p5_base"])
    for figures in (before, after, report["calibrated"]):
        assert 0 <= figures["min_bin_p5_base"] <= 1 and figures["tokens"] > 0
    summary = report["summary"]
    assert summary["distill_s_per_step"] > 0 and summary["update_s_per_step"] > 0
    assert summary["rollout_speedup_cheaper_over_calibrated"] > 0
