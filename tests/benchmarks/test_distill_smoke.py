"""benchmarks/distill.py --smoke: the DistillSparse measurement on CPU with the tiny model,
in a process where Ray, Prefect, MLflow, DuckDB and OmegaConf cannot be imported (the GPU
image has none of them).

    python -m pytest tests/benchmarks/test_distill_smoke.py -q     (a minute or two)
"""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.device_runner import run_benchmark

pytestmark = pytest.mark.slow


def test_smoke_reports_p5_before_after_and_timings(tmp_path):
    out, plot = tmp_path / "distill.json", tmp_path / "distill.png"
    done = run_benchmark("distill.py", "--smoke", "--out", str(out), "--plot", str(plot))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert len(report["steps"]) == 2 and plot.stat().st_size > 0
    before, after = report["before"], report["after"]
    # a fresh LoRA is the base: the same acceptance with and without it
    assert before["min_bin_p5_lora"] == pytest.approx(before["min_bin_p5_base"])
    for figures in (before, after, report["calibrated"]):
        assert 0 <= figures["min_bin_p5_base"] <= 1 and figures["tokens"] > 0
        assert 0 <= figures["reward_mean"] <= 1
    # the reward of every step's own rollouts is kept (the LoRA moves what the actor samples)
    assert all(0 <= s["reward_mean"] <= 1 for s in report["steps"])
    summary = report["summary"]
    assert summary["distill_s_per_step"] > 0 and summary["update_s_per_step"] > 0
    # the fixed set: the same tokens before and after, paired intervals around each difference
    fixed = report["fixed_set"]
    assert fixed["trajectories"] == 2 * fixed["prompts"] and fixed["tokens"] > 0
    assert 0 <= fixed["reward_mean"] <= 1
    for pair in ("lora_after_minus_before", "lora_minus_base_after"):
        for name, d in fixed[pair].items():
            assert d["low"] <= d["delta"] <= d["high"], (pair, name)
    assert fixed["lora_minus_base_after"]["mean"]["delta"] == pytest.approx(
        fixed["after_lora"]["mean"] - fixed["after_base"]["mean"]
    )
    assert summary["fixed_set_p5"]["lora_minus_base_after"] == fixed["lora_minus_base_after"]["p5"]
    assert summary["rollout_speedup_cheaper_over_calibrated"] > 0


def test_smoke_with_the_selector_term_records_it_every_step(tmp_path):
    out = tmp_path / "distill.json"
    done = run_benchmark(
        "distill.py", "--smoke", "--no-update", "--selector-coef", "1.0", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(out.read_text())["steps"]
    assert steps and all(s["selector_loss"] > 0 and 0 < s["selector_recall"] <= 1 for s in steps)
    # the base fixed (the fair test's runs): each step still says what its rollouts earned
    assert all("update_s" not in s and 0 <= s["reward_mean"] <= 1 for s in steps)
    assert json.loads(out.read_text())["args"]["selector_coef"] == 1.0
