"""benchmarks/vllm_baseline.py on CPU: its arguments, the workload both backends get, the JSON
and its ratios, with a stand-in `vllm` module (written below) in place of the real engine, in a
process where the orchestration packages cannot be imported (the GPU image has none).

    python -m pytest tests/benchmarks/test_vllm_baseline.py -q     (about a minute)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.benchmarks.device_runner import ROOT, run_benchmark

sys.path.insert(0, str(ROOT))
from benchmarks import vllm_baseline  # noqa: E402
from benchmarks.generation import random_prompts  # noqa: E402

# The stand-in records what it was asked (vLLM 0.23.0's names: the real module took these
# keywords on CPU) and answers with max_tokens ids per prompt.
FAKE_VLLM = """
import json, os
from types import SimpleNamespace
__version__ = "0.23.0-standin"
LLM_KEYWORDS = {"model", "dtype", "seed", "enable_prefix_caching", "max_model_len",
                "max_num_seqs", "gpu_memory_utilization", "attention_config"}
PARAM_KEYWORDS = {"max_tokens", "temperature", "ignore_eos", "detokenize", "logprobs"}
LOG = os.environ["FAKE_VLLM_LOG"]

class SamplingParams:
    def __init__(self, **kw):
        assert set(kw) <= PARAM_KEYWORDS, kw
        self.kw = kw

class LLM:
    def __init__(self, **kw):
        assert set(kw) <= LLM_KEYWORDS, kw
        if os.environ.get("FAKE_VLLM_FAIL") == "start":
            raise RuntimeError("stand-in vLLM refused to start")
        cache = SimpleNamespace(num_gpu_blocks=100, block_size=16)
        core = SimpleNamespace(shutdown=lambda: None)
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache),
                                          engine_core=core)
        self.calls = [{"llm": kw, "flashinfer_sampler": os.environ.get(
            "VLLM_USE_FLASHINFER_SAMPLER")}]

    def generate(self, prompts, params, use_tqdm=True):
        if os.environ.get("FAKE_VLLM_FAIL") == str(len(self.calls)):  # calls[0]: start
            raise RuntimeError(f"stand-in vLLM failed at generate call {len(self.calls)}")
        self.calls.append({"prompts": [p["prompt_token_ids"] for p in prompts],
                           "params": params.kw})
        with open(LOG, "w") as f:
            json.dump(self.calls, f)
        n = params.kw["max_tokens"]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1] * n)]) for _ in prompts]
"""


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    package = tmp_path / "standin" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_VLLM)
    log = tmp_path / "vllm_calls.json"
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    return log


def test_cases_parse_and_default_to_the_issue_matrix():
    args = vllm_baseline.parse_args(["--cases", "16x8192, 64X32768"])
    assert args.cases == [(16, 8192), (64, 32768)]
    full = vllm_baseline.parse_args([])
    assert full.cases == [(16, 8192), (16, 32768), (64, 8192), (64, 32768)]
    assert (full.prompt_len, full.schedule) == (1024, "qwen3-1.7b-0.86")
    assert vllm_baseline.parse_args(["--smoke", "--cases", "4x8"]).cases == [(4, 8)]
    for bad in ("16", "16x", "0x8", "16x8x2", "ax8"):
        with pytest.raises(SystemExit):
            vllm_baseline.parse_args(["--cases", bad])
    assert vllm_baseline.parse_args(["--native-arms", "sparse"]).native_arms == ("sparse",)
    with pytest.raises(SystemExit):
        vllm_baseline.parse_args(["--native-arms", "dense,paged"])


def test_vllm_requests_carry_the_native_prompts_and_the_issue_sampling():
    args = vllm_baseline.parse_args(["--prompt-len", "5", "--seed", "3"])
    prompts = vllm_baseline.case_prompts(args, 4, 151_936)
    assert prompts == random_prompts(4, 5, 151_936, seed=3)
    assert len({tuple(p) for p in prompts}) == 4 and max(map(max, prompts)) < 151_936
    requests, params = vllm_baseline.vllm_requests(prompts, 8192)
    assert [r["prompt_token_ids"] for r in requests] == prompts
    assert params == dict(max_tokens=8192, temperature=1.0, ignore_eos=True, detokenize=False)
    assert vllm_baseline.vllm_requests(prompts, 8, logprobs=20)[1]["logprobs"] == 20


def test_ratios_are_native_tokens_per_second_over_vllm_dense():
    rows = [
        vllm_baseline.arm_row("vllm_dense", 16, 8, 4.0, 0.0, 128, 1000),
        vllm_baseline.arm_row("native_sparse", 16, 8, 1.6, 0.1, 128, 900),
        vllm_baseline.arm_row("native_dense", 16, 8, 5.0, 0.1, 128, 900),
        vllm_baseline.arm_row("native_dense", 64, 8, 2.0, 0.0, 512, 900),
    ]
    case, other, missing = vllm_baseline.cases_table(rows, [(16, 8), (64, 8), (64, 32)])
    assert case["native_sparse_over_vllm_dense"] == pytest.approx(2.5)
    assert case["native_dense_over_vllm_dense"] == pytest.approx(0.8)
    assert other["vllm_dense"] is None and other["native_dense_over_vllm_dense"] is None
    assert missing["new_tokens"] == 32 and missing["native_sparse"] is None


@pytest.mark.slow
def test_smoke_run_times_all_three_arms_on_one_workload(tmp_path, fake_vllm):
    out = tmp_path / "vllm_baseline.json"
    done = run_benchmark(
        "vllm_baseline.py", "--smoke", "--workdir", str(tmp_path / "work"), "--out", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    [case] = report["cases"]
    assert (case["batch"], case["new_tokens"], report["prompt_len"]) == (2, 48, 48)
    for arm in vllm_baseline.ARMS:
        row = case[arm]
        assert row["tokens"] == 2 * 48 and row["seconds"] > 0 and row["kv_capacity_tokens"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["seconds"])
    assert case["vllm_dense"]["kv_capacity_tokens"] == 100 * 16
    assert case["native_sparse_over_vllm_dense"] == pytest.approx(
        case["native_sparse"]["tokens_per_s"] / case["vllm_dense"]["tokens_per_s"]
    )
    assert report["vllm"]["attention_backend"] == "FLASH_ATTN"
    assert report["native"]["schedule"] == "tiny-0.86"
    # vLLM got the native engine's prompts, warm-up then timed run, no prefix caching
    start, warmup, timed = json.loads(fake_vllm.read_text())
    assert start["flashinfer_sampler"] == "0"
    assert start["llm"]["enable_prefix_caching"] is False
    assert start["llm"]["attention_config"] == {"backend": "FLASH_ATTN"}
    assert start["llm"]["max_model_len"] >= 48 + 48
    vocab = json.loads((Path(report["model"]) / "config.json").read_text())["vocab_size"]
    assert timed["prompts"] == warmup["prompts"] == random_prompts(2, 48, vocab, seed=0)
    assert (warmup["params"]["max_tokens"], timed["params"]["max_tokens"]) == (8, 48)


@pytest.mark.slow
@pytest.mark.parametrize("fail_at, cases_done", [("start", 0), ("3", 1)])
def test_a_failing_backend_keeps_its_finished_cases_and_says_why(
    tmp_path, fake_vllm, monkeypatch, fail_at, cases_done
):
    """Failing at start-up, or at the second case's warm-up (the third generate call)."""
    monkeypatch.setenv("FAKE_VLLM_FAIL", fail_at)
    out = tmp_path / "vllm_baseline.json"
    done = run_benchmark(
        "vllm_baseline.py",
        "--smoke",
        "--skip-native",
        "--cases",
        "2x16,2x24",
        "--workdir",
        str(tmp_path / "work"),
        "--out",
        str(out),
    )
    assert done.returncode == 1
    report = json.loads(out.read_text())
    assert "RuntimeError: stand-in vLLM" in report["vllm"]["error"]
    assert report["native"] == {"skipped": True}
    rows = [case["vllm_dense"] for case in report["cases"]]
    assert [row is not None for row in rows] == [True] * cases_done + [False] * (2 - cases_done)


def test_merge_puts_runs_of_separate_calls_in_one_table(tmp_path):
    def run(arms, gpu):
        rows = [vllm_baseline.arm_row(arm, 16, 32768, s, 0.0, 16 * 32768, 10**6) for arm, s in arms]
        return {
            "facts": {"gpu": gpu},
            "prompt_len": 1024,
            "model": "m",
            "vllm": {},
            "native": {},
            "cases": vllm_baseline.cases_table(rows, [(16, 32768)]),
        }

    first, second = tmp_path / "vllm.json", tmp_path / "native.json"
    first.write_text(json.dumps(run([("vllm_dense", 300.0)], "H100")))
    second.write_text(json.dumps(run([("native_dense", 400.0), ("native_sparse", 120.0)], "H100")))
    out = tmp_path / "merged.json"
    assert vllm_baseline.main(["--merge", str(first), str(second), "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    [case] = merged["cases"]
    assert case["native_sparse_over_vllm_dense"] == pytest.approx(2.5)
    assert case["native_dense_over_vllm_dense"] == pytest.approx(0.75)
    assert merged["same_gpu_model"] is True and merged["merged_from"] == [str(first), str(second)]
    # a merged table merges again as the runs it holds (a later case joins the table)
    third = tmp_path / "b64.json"
    rows = [vllm_baseline.arm_row("vllm_dense", 64, 8192, 120.0, 0.0, 64 * 8192, 10**6)]
    third.write_text(
        json.dumps(
            {
                "facts": {"gpu": "H200"},
                "prompt_len": 1024,
                "model": "m",
                "vllm": {"v": 1},
                "native": {},
                "cases": vllm_baseline.cases_table(rows, [(64, 8192)]),
            }
        )
    )
    again = vllm_baseline.merge([str(out), str(third)])
    assert [(c["batch"], c["new_tokens"]) for c in again["cases"]] == [(16, 32768), (64, 8192)]
    assert again["cases"][0] == case
    assert again["merged_from"] == [str(first), str(second), str(third)]
    assert [f["gpu"] for f in again["facts"]] == ["H100", "H100", "H200"]
    assert again["gpus"] == ["H100", "H200"] and again["same_gpu_model"] is False
    assert again["vllm"] == [{}, {}, {"v": 1}]
    other = json.loads(second.read_text())
    other["prompt_len"] = 512
    second.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="different prompt lengths"):
        vllm_baseline.main(["--merge", str(first), str(second)])
