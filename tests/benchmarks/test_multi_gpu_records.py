"""benchmarks/multi_gpu.py turns engine results into rollout records, flattens each step's
breakdown for the mean, and defaults to a case two GPUs can help (its --smoke run, 2 CPU
ranks, is too slow for the suite; this holds the parts that run without Ray)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import multi_gpu  # noqa: E402

from sparrow.engine.sequence import SampleResult  # noqa: E402


def test_records_of_carries_every_field_of_a_sample():
    sample = SampleResult(
        prompt_index=0,
        sample_index=1,
        output_ids=(5, 6),
        logprobs=(-0.5, -1.5),
        topk_ids=((5, 7), (6, 8)),
        topk_logprobs=((-0.5, -2.0), (-1.5, -1.6)),
        pages_read=(3, 4),
        finish_reason="length",
    )
    records = multi_gpu.records_of([[1, 2, 3]], [[sample]])
    assert len(records) == 1
    record = records[0]
    assert record.prompt_ids == (1, 2, 3)
    assert record.output_ids == (5, 6)
    assert record.pages_read == (3, 4)
    assert record.finish_reason == "length"


def fake_step(scale: float) -> dict:
    engines = [
        {"busy_s": 2.0 * scale, "seconds": 1.5 * scale, "capture_s": 0.25, "decode_steps": 1024},
        {"busy_s": 3.0 * scale, "seconds": 2.5 * scale, "decode_steps": 2048},
    ]
    sync = {
        "connect_s": 0.01,
        "gather_s": 0.5 * scale,
        "pack_s": 0.4,
        "transfer_s": 0.25,
        "engines": [{"mode": "ipc", "load_s": 0.02}, {"mode": "nccl", "load_s": 0.125}],
    }
    step = {
        "rollout": {"wake_s": 0.1, "generate_s": 3.5 * scale, "engines": engines},
        "rollout_s": 4.0 * scale,
        "score_s": 1.0,
        "score_ranks": [0.5, 0.75],
        "update_s": 2.0,
        "update_ranks": [1.5, 1.25],
        "sync": sync,
        "sync_s": 1.0,
        "step_s": 8.0,
        "loss": 0.5,
        "generated_tokens": 128.0,
        "sync_modes": ["ipc"],
    }
    step.update(multi_gpu.summary(step))
    return step


def test_summary_flattens_the_breakdown_and_the_mean_skips_loss_and_tokens():
    step = fake_step(1.0)
    # the busiest engine, the slowest rank, the slowest engine load
    assert step["rollout_engine_busy_max_s"] == 3.0
    assert step["rollout_engine_inside_max_s"] == 2.5
    assert step["rollout_capture_max_s"] == 0.25  # an engine without graphs counts 0
    assert step["rollout_decode_steps_max"] == 2048.0
    assert step["score_rank_max_s"] == 0.75 and step["update_rank_max_s"] == 1.5
    assert step["sync_gather_s"] == 0.5 and step["sync_load_max_s"] == 0.125
    mean = multi_gpu.mean_of([step, fake_step(3.0)])
    assert mean["rollout_s"] == 8.0 and mean["rollout_engine_busy_max_s"] == 6.0
    assert mean["sync_gather_s"] == 1.0 and mean["step_s"] == 8.0
    assert "loss" not in mean and "generated_tokens" not in mean and "sync" not in mean


def test_defaults_give_each_engine_of_two_a_full_batch_and_the_old_case_stays():
    args = multi_gpu.parse_args([])
    # one engine: more samples than it batches at once; two: one full wave each
    assert args.prompts * args.samples == 2 * args.max_batch
    assert args.work_item_prompts == 0
    old = multi_gpu.parse_args(["--prompts", "16", "--work-item-prompts", "2"])
    assert (old.prompts, old.samples, old.new_tokens, old.layers) == (16, 8, 1024, 8)


def arm_report(tmp_path, ranks: int, step_s: float, **case) -> str:
    """One call's JSON with one arm, as `multi_gpu.py --gpus N --out F` writes it."""
    import json

    args = multi_gpu.parse_args([])
    fields = {k: getattr(args, k) for k in multi_gpu.CASE_KEYS} | case
    arm = {
        "ranks": ranks,
        "steps": [],
        "mean": {
            "step_s": step_s,
            "rollout_s": step_s / 2,
            "score_s": step_s / 4,
            "update_s": step_s / 4,
        },
    }
    path = tmp_path / f"arm{ranks}.json"
    path.write_text(json.dumps(multi_gpu.report_of(fields, [arm], {"gpu": "H100"})))
    return str(path)


def test_merge_joins_arms_of_separate_calls_in_rank_order(tmp_path):
    two, one = arm_report(tmp_path, 2, 20.0), arm_report(tmp_path, 1, 30.0)
    report = multi_gpu.merge([two, one])
    assert [a["ranks"] for a in report["arms"]] == [1, 2]
    assert report["step_speedup"] == 1.5
    assert "speedup" not in report["arms"][0]
    assert report["arms"][1]["speedup"] == dict.fromkeys(
        ("step_s", "rollout_s", "score_s", "update_s"), 1.5
    )
    assert report["merged_from"] == [two, one] and len(report["facts"]) == 2


def test_merge_refuses_arms_of_different_cases(tmp_path):
    import pytest

    one = arm_report(tmp_path, 1, 30.0)
    two = arm_report(tmp_path, 2, 20.0, prompts=16)
    with pytest.raises(SystemExit, match="differ in their case"):
        multi_gpu.merge([one, two])


def test_budgets_are_even_or_a_seeded_spread():
    args = multi_gpu.parse_args([])
    assert multi_gpu.token_budgets(args) == [1024] * 64
    spread = multi_gpu.parse_args(["--min-new-tokens", "128"])
    budgets = multi_gpu.token_budgets(spread)
    assert budgets == multi_gpu.token_budgets(spread) and len(budgets) == 64
    assert 128 <= min(budgets) < 400 and 800 < max(budgets) <= 1024
