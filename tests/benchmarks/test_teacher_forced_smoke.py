"""benchmarks/teacher_forced.py --smoke: both replay paths (the Triton kernels' launchers,
here their PyTorch references, and FlexAttention eager) on CPU, in a process where Ray,
Prefect, MLflow, DuckDB and OmegaConf cannot be imported (the GPU image has none of them).

    python -m pytest tests/benchmarks/test_teacher_forced_smoke.py -q     (about a minute)
"""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.device_runner import run_benchmark

pytestmark = pytest.mark.slow


def test_smoke_times_both_paths_and_they_agree(tmp_path):
    out = tmp_path / "teacher_forced.json"
    done = run_benchmark("teacher_forced.py", "--smoke", "--reps", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    [row] = report["rows"]
    for path in ("triton", "flex"):
        for key in ("selection_s", "layer_s", "replay_s", "replay_over_dense"):
            assert row[f"{path}_{key}"] > 0, (path, key)
    assert set(row["triton_attention_launches_s"]) >= {"default", "tile_skip"}
    # the same pages through two attention paths: equal to bf16 rounding
    assert row["triton_vs_flex_max_abs"] < 5e-2
    # the tiny schedule reads part of the pages, not all of them (nor none)
    assert 0.2 < row["triton_pages_read_share"] < 1.0


def test_smoke_backward_times_forward_and_backward_per_path(tmp_path):
    """--backward on CPU: the triton path (its launchers' references here) against the
    reference path, forward and backward of one layer; FlexAttention has no CPU backward."""
    out = tmp_path / "teacher_forced_backward.json"
    done = run_benchmark(
        "teacher_forced.py",
        "--smoke",
        "--skip-model",
        "--backward",
        "--backends",
        "triton,flex,reference",
        "--reps",
        "1",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads(out.read_text())["rows"]
    for key in ("dense_fwd_bwd_layer_s", "triton_fwd_bwd_layer_s", "reference_fwd_bwd_layer_s"):
        assert row[key] > 0, key
    assert "flex_fwd_bwd_layer_s" not in row
    assert row["triton_vs_reference_grad_rel_diff"] < 1e-3
