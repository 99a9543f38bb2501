"""`sparrow costmodel`, called through sparrow.cli.main.main."""

from __future__ import annotations

import json

import pytest

from sparrow.cli.main import main
from sparrow.costmodel import dense_cost, get_hardware, get_model, sparse_cost
from sparrow.sparse.io import save_schedule_yaml
from sparrow.sparse.schedule import Schedule

ARGS = [
    "costmodel",
    "--model",
    "qwen3-1.7b",
    "--schedule",
    "qwen3-1.7b-0.86",
    "--prompt-len",
    "1024",
    "--gen-len",
    "32768",
    "--samples",
    "8",
    "--hardware",
    "h200",
]


def _run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("variant", ["paper", "appendix"])
def test_json_dense_matches_formula_and_bins_add_up(capsys, variant):
    data = _run_json(capsys, ARGS + ["--variant", variant])
    m, h = get_model("qwen3-1.7b"), get_hardware("h200")
    dense = dense_cost(
        params=m.parameters,
        samples=8,
        prompt_len=1024,
        gen_len=32768,
        kv_dim=m.kv_dim,
        gqa_ratio=m.gqa_ratio,
        intensity=h.intensity,
        variant=variant,
    )
    assert data["dense_eflops"] == pytest.approx(dense.total, rel=1e-12)
    assert data["predicted_speedup"] == pytest.approx(data["dense_eflops"] / data["sparse_eflops"])
    assert data["sparse_eflops"] == pytest.approx(sum(b["sparse_eflops"] for b in data["bins"]))
    assert (data["prompt_len"], data["gen_len"], data["samples"], data["variant"]) == (
        1024,
        32768,
        8,
        variant,
    )
    assert data["inputs"]["params"] == m.parameters and data["inputs"]["kv_dim"] == 28 * 8 * 128
    # positions 1024 .. 33791 pass through bins 0..16; bin 16 budget (253 + 3) * 16
    assert [b["bin"] for b in data["bins"]] == list(range(17))
    assert data["bins"][-1]["budget_tokens"] == 4096 and data["bins"][-1]["end_position"] == 33792


def test_appendix_predicts_less_than_paper(capsys):
    paper = _run_json(capsys, ARGS)["predicted_speedup"]
    appendix = _run_json(capsys, ARGS + ["--variant", "appendix"])["predicted_speedup"]
    # parameter traffic is the same in dense and sparse decode, so it dilutes the gain
    assert 1 < appendix < paper


def test_schedule_file_with_one_budget_matches_sparse_formula(tmp_path, capsys):
    # one budget of (61 + 3) * 16 = 1024 tokens, below the 2048 prompt: every step sparse
    path = save_schedule_yaml(Schedule(name="flat", topk_pages=(61,)), tmp_path / "flat.yaml")
    data = _run_json(
        capsys,
        [
            "costmodel",
            "--schedule",
            str(path),
            "--prompt-len",
            "2048",
            "--gen-len",
            "4000",
            "--samples",
            "4",
            "--hardware",
            "h100",
            "--model",
            "qwen3-8b",
        ],
    )
    m, h = get_model("qwen3-8b"), get_hardware("h100")
    sparse = sparse_cost(
        params=m.parameters,
        samples=4,
        prompt_len=2048,
        gen_len=4000,
        kv_dim=m.kv_dim,
        gqa_ratio=m.gqa_ratio,
        intensity=h.intensity,
        budget_tokens=1024,
        page_size=16,
    )
    assert data["sparse_eflops"] == pytest.approx(sparse.total, rel=1e-12)
    assert data["schedule"] == "flat" and data["inputs"]["schedule_spec"] == str(path)


def test_human_output(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "predicted speedup" in out and "qwen3-1.7b-0.86" in out and "4096" in out


@pytest.mark.parametrize(
    "flag, value, fragment",
    [
        ("--model", "llama-7b", "valid models: qwen3-0.6b"),
        ("--hardware", "a100", "valid hardware: h100, h200"),
        ("--variant", "exact", "paper, appendix"),
        ("--schedule", "missing.yaml", "missing.yaml"),
        ("--gen-len", "0", "gen_len"),
    ],
)
def test_bad_input_is_one_line(capsys, flag, value, fragment):
    assert main(["costmodel", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err
