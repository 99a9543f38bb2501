"""The train flow end to end (Prefect, Ray, DuckDB, MLflow), and resume after a failure.

Two steps of the embedded default at test size; the values in the tables are checked against
the stage files, recomputed with numpy and the reward function itself. A run failed on
purpose and resumed must not re-run its finished stages and must end equal to the
uninterrupted run. Run: `python -m pytest tests/flows/test_train_flow.py -q`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from sparrow.data.rollouts import read_rollouts
from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.sparse import get_preset
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    # SQLAlchemy deprecations inside MLflow and Prefect, and the embedded model's stand-in notice
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

STEP_STAGES = (
    "rollout",
    "reward",
    "dense_score",
    "aggregate_mismatch",
    "reoptimize_schedule",
    "policy_update",
    "sync_weights",
)
# metrics that measure wall-clock time and so differ between two runs of the same inputs
TIMING = ("time/", "rollout/tokens_per_s")


def rows(workdir: Path, sql: str, params=None) -> list[dict]:
    return query(workdir, sql, params).as_dicts()


def step_dir(workdir: Path, run_id: str, step: int, stage: str) -> Path:
    return workdir / "runs" / run_id / f"step-{step}" / stage


def metrics_of(workdir: Path, run_id: str) -> dict[tuple[int, str], float]:
    return {
        (r["step"], r["name"]): r["value"]
        for r in rows(
            workdir, "SELECT step, name, value FROM step_metrics WHERE run_id = ?", [run_id]
        )
        if not r["name"].startswith(TIMING)
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory, flow_environment, small_overrides):
    flow_environment.start()
    workdir = tmp_path_factory.mktemp("reference") / "work"
    summary = train_flow(small_overrides(workdir, "ref"), show_table=False)
    return workdir, summary


def test_two_steps_record_every_stage(reference):
    workdir, summary = reference
    assert summary["status"] == "finished" and not summary["resumed"]
    # checkpoint after the last step only (checkpoint_every=0), evaluate every 2 steps
    assert summary["stages_run"] == {**{s: 2 for s in STEP_STAGES}, "checkpoint": 1, "evaluate": 1}
    recorded = {
        (r["step"], r["stage"])
        for r in rows(workdir, "SELECT step, stage FROM stage_runs WHERE run_id = 'ref'")
    }
    assert recorded == {(s, st) for s in (1, 2) for st in STEP_STAGES} | {
        (2, "checkpoint"),
        (2, "evaluate"),
    }
    [run] = rows(workdir, "SELECT status, mlflow_run_id, config_yaml FROM runs")
    assert run["status"] == "finished" and run["mlflow_run_id"] == summary["mlflow_run_id"]
    assert "test_char_code" in run["config_yaml"]


def test_reward_and_length_metrics_match_the_files(reference, reward_fn):
    workdir, _ = reference
    metrics = metrics_of(workdir, "ref")
    for step in (1, 2):
        records = read_rollouts(step_dir(workdir, "ref", step, "rollout") / "rollouts.parquet")
        assert len(records) == 4 and {(r.prompt_index, r.sample_index) for r in records} == {
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        }
        expected = [reward_fn(r.text, r.answer) for r in records]
        rewards = pq.read_table(step_dir(workdir, "ref", step, "reward") / "rewards.parquet")
        assert rewards.column("reward").to_pylist() == pytest.approx(expected)
        assert metrics[(step, "reward/mean")] == pytest.approx(np.mean(expected))
        lengths = [len(r.output_ids) for r in records]
        assert metrics[(step, "response/length_mean")] == pytest.approx(np.mean(lengths))
        assert metrics[(step, "reward/errors")] == 0
        # the step-2 prompts are the dataset's rows 2 and 3, not step 1's again
        assert sorted({r.dataset_row for r in records}) == [2 * step - 2, 2 * step - 1]


def test_evaluation_is_greedy_dense_decoding_of_the_step_policy(reference, reward_fn):
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model, load_tokenizer

    workdir, _ = reference
    result = json.loads((step_dir(workdir, "ref", 2, "evaluate") / "eval.json").read_text())
    # prompts_per_step x samples_per_prompt rows of the eval split, none a training prompt
    assert [r["row"] for r in result["rows"]] == [0, 1, 2, 3]
    train = {
        tuple(r.prompt_ids)
        for step in (1, 2)
        for r in read_rollouts(step_dir(workdir, "ref", step, "rollout") / "rollouts.parquet")
    }
    policy = step_dir(workdir, "ref", 2, "policy_update")
    tokenizer = load_tokenizer(policy)
    prompts = [tokenizer.encode(r["prompt"]) for r in result["rows"]]
    assert not {tuple(p) for p in prompts} & train
    engine = Engine(load_model(policy), tokenizer, EngineConfig(max_batch_size=4), None)
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert [[samples[0].text] for samples in greedy] == [r["completions"] for r in result["rows"]]
    rewards = [reward_fn(r["completions"][0], r["answer"]) for r in result["rows"]]
    assert [r["rewards"][0] for r in result["rows"]] == pytest.approx(rewards)
    assert all(len(r["rewards"]) == 1 for r in result["rows"])
    assert metrics_of(workdir, "ref")[(2, "eval/accuracy")] == pytest.approx(np.mean(rewards))


def test_evaluation_at_a_temperature_samples_the_step_policy_once_per_prompt(
    tmp_path, small_overrides, reward_fn
):
    """pipeline.eval_temperature > 0: each eval prompt one dense sample at that temperature,
    seeded as a rollout request is (the same engine call gives the same completions)."""
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model, load_tokenizer
    from sparrow.runtime.rollout.requests import request_seed

    workdir = tmp_path / "work"
    train_flow(
        small_overrides(
            workdir,
            "hot",
            "pipeline.steps=1",
            "pipeline.eval_every=1",
            "pipeline.eval_temperature=3.0",
        ),
        show_table=False,
    )
    result = json.loads((step_dir(workdir, "hot", 1, "evaluate") / "eval.json").read_text())
    assert result["temperature"] == 3.0 and len(result["rows"]) == 4
    policy = step_dir(workdir, "hot", 1, "policy_update")
    tokenizer = load_tokenizer(policy)
    prompts = [tokenizer.encode(r["prompt"]) for r in result["rows"]]
    engine = Engine(load_model(policy), tokenizer, EngineConfig(max_batch_size=4), None)
    sampled = [
        engine.generate(
            [prompt],
            SamplingParams(temperature=3.0, max_new_tokens=24, seed=request_seed(0, 0, 1, index)),
        )[0][0].text
        for index, prompt in enumerate(prompts)
    ]
    assert [[text] for text in sampled] == [r["completions"] for r in result["rows"]]
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert [g[0].text for g in greedy] != sampled  # not the greedy answers
    metrics = metrics_of(workdir, "hot")
    assert metrics[(1, "eval/temperature")] == 3.0
    assert metrics[(1, "eval/accuracy")] == pytest.approx(
        np.mean([reward_fn(r["completions"][0], r["answer"]) for r in result["rows"]])
    )


def test_bin_stats_and_events_match_the_token_file(reference):
    workdir, _ = reference
    schedule = get_preset("tiny-0.86")
    metrics = metrics_of(workdir, "ref")
    for step in (1, 2):
        tokens = pq.read_table(
            step_dir(workdir, "ref", step, "aggregate_mismatch") / "tokens.parquet"
        ).to_pydict()
        records = read_rollouts(step_dir(workdir, "ref", step, "rollout") / "rollouts.parquet")
        assert len(tokens["position"]) == sum(len(r.output_ids) for r in records)
        first = records[0]
        n = len(first.output_ids)
        assert tokens["position"][:n] == list(
            range(len(first.prompt_ids), len(first.prompt_ids) + n)
        )
        assert tokens["actor_logprob"][:n] == pytest.approx(list(first.actor_logprobs))
        positions, acceptance = np.array(tokens["position"]), np.array(tokens["acceptance"])
        stats = rows(
            workdir,
            "SELECT * FROM bin_stats WHERE run_id = 'ref' AND step = ? ORDER BY bin",
            [step],
        )
        # past the schedule's last bin is the last bin (docs/method.md)
        token_bins = np.minimum(positions // schedule.bin_tokens, schedule.num_bins - 1)
        assert tokens["bin"] == token_bins.tolist()
        assert [s["bin"] for s in stats] == sorted(set(token_bins.tolist()))
        for s in stats:
            in_bin = acceptance[token_bins == s["bin"]]
            assert s["n"] == in_bin.size
            assert s["p5"] == pytest.approx(np.percentile(in_bin, 5))
            assert s["pages_read"] == schedule.topk_pages[s["bin"]] + 3  # reserved 1 + 2
            assert (s["schedule_name"], s["schedule_version"]) == ("tiny-0.86", 1)
        # the worst bin is taken over the bins above the floor (8 tokens, 2 trajectories here)
        for s in stats:
            assert s["counted"] == (s["n"] >= 8 and s["samples"] >= 2)
        counted = [s["p5"] for s in stats if s["counted"]]
        assert counted and metrics[(step, "mismatch/min_p5")] == pytest.approx(min(counted))
        events = rows(
            workdir,
            "SELECT bin, p5 FROM threshold_events WHERE run_id = 'ref' AND "
            "step = ? AND kind = 'below_target' ORDER BY bin",
            [step],
        )
        assert [e["bin"] for e in events] == [s["bin"] for s in stats if s["p5"] < 0.86]
    [version] = rows(workdir, "SELECT version, topk_pages, reason FROM schedules")
    assert version == {"version": 1, "topk_pages": list(schedule.topk_pages), "reason": "initial"}


def test_mlflow_run_holds_the_step_metrics(reference):
    from mlflow.tracking import MlflowClient

    workdir, summary = reference
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir.resolve()}/mlflow.db")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["sparrow.run_id"] == "ref"
    metrics = metrics_of(workdir, "ref")
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [
        (s, pytest.approx(metrics[(s, "reward/mean")])) for s in (1, 2)
    ]
    p5 = client.get_metric_history(run.info.run_id, "mismatch/min_p5")
    assert sorted(m.step for m in p5) == [1, 2]
    below = sum(1 for (s, name), v in metrics.items() if name == "mismatch/bins_below" and v > 0)
    events = client.get_metric_history(run.info.run_id, "threshold/below_target")
    assert len({m.step for m in events}) == below
    assert run.data.tags["sparrow.schedule"] == "tiny-0.86"
    assert run.data.tags["sparrow.schedule_version"] == "1"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "schedules", "bin_stats"} <= artifacts
    stats = {a.path for a in client.list_artifacts(run.info.run_id, "bin_stats")}
    assert stats == {"bin_stats/step-1", "bin_stats/step-2"}
    # pipeline.report=false (small_overrides): no report, here or in the run folder
    assert "plots" not in artifacts and not (workdir / "runs" / "ref" / "report").exists()


def test_checkpoint_is_the_last_policy(reference):
    workdir, _ = reference
    policy = step_dir(workdir, "ref", 2, "policy_update")
    checkpoint = workdir / "runs" / "ref" / "checkpoints" / "step-2"
    saved, kept = (
        load_file(policy / "model.safetensors"),
        load_file(checkpoint / "model.safetensors"),
    )
    assert saved.keys() == kept.keys() and all((saved[k] == kept[k]).all() for k in saved)
    start = load_file(
        Path(rows(workdir, "SELECT model_path FROM runs")[0]["model_path"]) / "model.safetensors"
    )
    # some prompt's samples got different rewards, so advantages were not all 0 ...
    groups = [
        pq.read_table(step_dir(workdir, "ref", step, "reward") / "rewards.parquet")
        .to_pandas()
        .groupby("prompt_index")["reward"]
        .nunique()
        for step in (1, 2)
    ]
    assert any((g > 1).any() for g in groups)
    # ... and the update moved the weights
    assert any(not (start[k] == saved[k]).all() for k in saved if k in start)


def test_fail_then_resume_skips_finished_stages_and_ends_equal(
    reference, tmp_path, small_overrides
):
    ref_workdir, _ = reference
    workdir = tmp_path / "work"
    with pytest.raises(StageFailedOnPurpose, match="policy_update.*step 2"):
        train_flow(
            small_overrides(workdir, "r", "pipeline.fail_at=policy_update@2"), show_table=False
        )
    assert not step_dir(workdir, "r", 2, "policy_update").exists()
    assert rows(workdir, "SELECT status FROM runs") == [{"status": "failed"}]
    before = {p: p.stat().st_mtime_ns for p in (workdir / "runs" / "r").rglob("*") if p.is_file()}
    started = rows(workdir, "SELECT step, stage, started_at FROM stage_runs ORDER BY step, stage")
    assert len(started) == 7 + 5

    summary = train_flow(small_overrides(workdir, "r"), show_table=False)
    assert summary["resumed"] and summary["status"] == "finished"
    assert summary["stages_run"] == {
        "policy_update": 1,
        "sync_weights": 1,
        "checkpoint": 1,
        "evaluate": 1,
    }
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert (
        rows(
            workdir,
            "SELECT step, stage, started_at FROM stage_runs WHERE NOT "
            "(step = 2 AND stage IN ('policy_update', 'sync_weights', 'checkpoint', 'evaluate')) "
            "ORDER BY step, stage",
        )
        == started
    )
    resumed, uninterrupted = metrics_of(workdir, "r"), metrics_of(ref_workdir, "ref")
    assert resumed.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        assert resumed[key] == value or (math.isnan(value) and math.isnan(resumed[key])), key
    final = load_file(step_dir(workdir, "r", 2, "policy_update") / "model.safetensors")
    expected = load_file(step_dir(ref_workdir, "ref", 2, "policy_update") / "model.safetensors")
    assert all(torch_equal(final[k], expected[k]) for k in expected)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_a_ctrl_c_a_library_turned_into_its_own_error_still_interrupts(
    tmp_path, small_overrides, monkeypatch
):
    """A Ctrl-C can land inside a library that reports it as an error of its own (DuckDB's
    `RuntimeError: Query interrupted`); once a Ctrl-C was requested, the flow stops on any
    error as interrupted (resumable, exit 130 in the CLI), not failed."""
    from sparrow.runtime import interrupt

    monkeypatch.setattr(interrupt, "_requested", True)
    monkeypatch.setattr(interrupt, "check", lambda: None)  # the request reaches no boundary
    workdir = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):  # pipeline.fail_at stands in for the library's error
        train_flow(small_overrides(workdir, "c", "pipeline.fail_at=reward@1"), show_table=False)
    assert rows(workdir, "SELECT status FROM runs") == [{"status": "interrupted"}]
