"""benchmarks/paper_table.py: its arguments per size, the merge of separate calls, and its
--smoke run (the real flow with a trainer group of 2 CPU ranks and 2 engines, tiny model).

    python -m pytest tests/benchmarks/test_paper_table.py -q     (the smoke run: minutes)

The smoke run's arm processes report to the session's Prefect test API and join its Ray
(tests/conftest.py, FlowEnvironment), as tests/benchmarks/test_rl_step_smoke.py's do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import paper_table  # noqa: E402


def test_each_size_gets_its_preset_depth_and_the_group_settings():
    args = paper_table.parse_args(["--gpus", "4", "--layers", "4", "--set", "algo.lr=1e-6"])
    assert args.prompts * args.samples == 64 and args.new_tokens == 32768
    for size in ("1.7b", "4b", "8b"):
        sized = paper_table.case_args(args, size)
        assert sized.schedule == f"qwen3-{size}-0.86" and sized.layers == 4
        assert sized.workdir.endswith(f"{size}-4l-4gpu")
        assert "trainer.num_workers=4" in sized.set and "rollout.num_actors=4" in sized.set
        assert "trainer.offload_during_rollout=true" in sized.set
        assert sized.set[-1] == "algo.lr=1e-6"  # the caller's settings last, so they win
    full = paper_table.parse_args(["--sizes", "8b"])
    assert paper_table.case_args(full, "8b").layers == 36
    assert paper_table.SHAPES["8b"]["tie_word_embeddings"] is False


def test_paper_rows_hold_the_published_figures():
    assert (paper_table.PAPER["4b"]["dense_tok_s"], paper_table.PAPER["4b"]["sparse_tok_s"]) == (
        1369,
        3308,
    )
    for row in paper_table.PAPER.values():  # the rollout speedup is the tokens/s ratio
        assert abs(row["sparse_tok_s"] / row["dense_tok_s"] - row["rollout_speedup"]) < 0.01


def test_merge_orders_sizes_as_the_table_does(tmp_path):
    paths = []
    for size in ("8b", "1.7b"):
        path = tmp_path / f"{size}.json"
        path.write_text(json.dumps({"facts": {"gpu": "H100"}, "sizes": [{"size": size}]}))
        paths.append(str(path))
    merged = paper_table.merge(paths)
    assert [r["size"] for r in merged["sizes"]] == ["1.7b", "8b"]
    assert merged["merged_from"] == paths and len(merged["facts"]) == 2


def test_smoke_run_reports_each_arm_through_a_trainer_group(run_flow_smoke):
    out = run_flow_smoke("paper_table.py", 1200)
    (row,) = json.loads(out.read_text())["sizes"]
    assert row["size"] == "1.7b" and row["gpus"] == 2 and row["batch"] == 4
    assert row["paper"]["step_speedup"] == 1.97
    assert row["rollout_speedup"] > 0 and row["step_speedup"] > 0
    for arm in ("dense", "sparse"):
        stats = row["arms"][arm]
        assert stats["tokens"] == 4 * 24  # eos off: every sample to the cutoff
        per_gpu = stats["rollout_tokens_per_s_per_gpu"]
        assert per_gpu * 2 == stats["rollout_tokens_per_s"]
        assert stats["sync_s"] > 0 and stats["timed_steps"] == [2]
        # step 1 apart: the group starts (and compiles) there, so it is the longer
        assert stats["step1"]["stage_s"]["dense_score"] > 0
        assert stats["step1"]["step_s"] > 0
