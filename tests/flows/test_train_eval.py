"""Evaluation during training on a community-layout Parquet file: n samples per prompt,
accuracy and pass@k per data_source in the step metrics, DuckDB's eval_results and MLflow,
recomputed here from eval.json's completions; a run failed in its evaluation resumes there.

Run: `python -m pytest tests/flows/test_train_eval.py -q` (slow: two short flow runs).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.data.rewards import REWARD_FUNCTIONS
from sparrow.data.synthetic import DEFAULT_TASK, make_examples
from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

SOURCES = ("chase/a", "chase/b@2")
SAMPLES = 3


def write_eval_file(folder: Path) -> tuple[Path, Path]:
    """Six chase questions the training stream never asks, as chat messages, and a template
    that renders a message as its bare text (the prompt the embedded model was trained on)."""
    examples = make_examples(DEFAULT_TASK, 6, seed=424242)
    table = pa.table(
        {
            "data_source": [SOURCES[i % 2] for i in range(6)],
            "prompt": [[{"role": "user", "content": e.prompt}] for e in examples],
            "ability": ["lookup"] * 6,
            "reward_model": [{"style": "rule", "ground_truth": e.answer} for e in examples],
            "extra_info": [{"split": "test", "index": i} for i in range(6)],
        }
    )
    path = folder / "eval.parquet"
    pq.write_table(table, path)
    template = folder / "bare.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return path, template


def pass_at_k_by_subsets(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def rows(workdir: Path, sql: str, params=None) -> list[dict]:
    return query(workdir, sql, params).as_dicts()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, flow_environment, small_overrides):
    """Two steps, evaluated after each; the first attempt fails at step 2's evaluation."""
    flow_environment.start()
    folder = tmp_path_factory.mktemp("eval")
    path, template = write_eval_file(folder)
    workdir = folder / "work"
    overrides = small_overrides(
        workdir,
        "ev",
        f"data.eval={path}",
        f"data.chat_template={template}",
        'data.reward_by_source={"chase/*": exact_match}',
        "pipeline.eval_every=1",
        f"pipeline.eval_samples={SAMPLES}",
        "pipeline.eval_temperature=1.0",
        # room for a 12-hop chain and its answer line, so some samples are right
        "rollout.max_new_tokens=96",
    )
    with pytest.raises(StageFailedOnPurpose, match="evaluate.*step 2"):
        train_flow([*overrides, "pipeline.fail_at=evaluate@2"], show_table=False)
    first = rows(workdir, "SELECT * FROM eval_results ORDER BY step, data_source, k")
    started = rows(workdir, "SELECT step, stage, started_at FROM stage_runs ORDER BY step, stage")
    summary = train_flow(overrides, show_table=False)
    return workdir, summary, first, started


def eval_file(workdir: Path, step: int) -> dict:
    path = workdir / "runs" / "ev" / f"step-{step}" / "evaluate" / "eval.json"
    return json.loads(path.read_text())


def test_the_resumed_run_evaluates_only_the_missing_step(evaluated):
    workdir, summary, first, started = evaluated
    # checkpoint runs before evaluate: step 2's was recorded by the failed attempt
    assert summary["resumed"] and summary["stages_run"] == {"evaluate": 1}
    assert {r["step"] for r in first} == {1}  # the failed attempt recorded step 1's only
    now = rows(workdir, "SELECT * FROM eval_results ORDER BY step, data_source, k")
    assert [r for r in now if r["step"] == 1] == first
    assert {r["step"] for r in now} == {1, 2}
    kept = rows(workdir, "SELECT step, stage, started_at FROM stage_runs ORDER BY step, stage")
    assert [r for r in kept if (r["step"], r["stage"]) != (2, "evaluate")] == started


@pytest.mark.parametrize("step", [1, 2])
def test_scores_per_source_match_the_completions(evaluated, step):
    workdir, _, _, _ = evaluated
    result = eval_file(workdir, step)
    examples = make_examples(DEFAULT_TASK, 6, seed=424242)
    exact_match = REWARD_FUNCTIONS.get("exact_match")
    assert [r["prompt"] for r in result["rows"]] == [e.prompt for e in examples]  # templated
    stored = rows(
        workdir, "SELECT * FROM eval_results WHERE run_id = 'ev' AND step = ? ORDER BY k", [step]
    )
    metrics = {
        r["name"]: r["value"]
        for r in rows(
            workdir, "SELECT name, value FROM step_metrics WHERE run_id='ev' AND step=?", [step]
        )
    }
    all_rewards = []
    for source, name in zip(SOURCES, ("chase/a", "chase/b_2")):
        mine = [r for r in result["rows"] if r["data_source"] == source]
        assert len(mine) == 3 and all(len(r["completions"]) == SAMPLES for r in mine)
        rewards = [[exact_match(c, r["answer"]) for c in r["completions"]] for r in mine]
        assert [r["rewards"] for r in mine] == rewards
        all_rewards += [x for sample in rewards for x in sample]
        accuracy = sum(map(sum, rewards)) / (3 * SAMPLES)
        for k in (1, 2, SAMPLES):
            expected = sum(pass_at_k_by_subsets([x == 1 for x in s], k) for s in rewards) / 3
            assert metrics[f"eval/{name}/pass_at_{k}"] == pytest.approx(expected)
            [row] = [r for r in stored if r["data_source"] == source and r["k"] == k]
            assert row["pass_at_k"] == pytest.approx(expected)
            assert row["accuracy"] == pytest.approx(accuracy)
            assert (row["prompts"], row["samples_per_prompt"]) == (3, SAMPLES)
        assert metrics[f"eval/{name}/accuracy"] == pytest.approx(accuracy)
    assert metrics["eval/accuracy"] == pytest.approx(sum(all_rewards) / len(all_rewards))
    assert 0 < metrics["eval/accuracy"] < 1  # samples differ: some right, some wrong


def test_mlflow_holds_the_per_source_metrics(evaluated):
    from mlflow.tracking import MlflowClient

    workdir, summary, _, _ = evaluated
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir.resolve()}/mlflow.db")
    history = client.get_metric_history(summary["mlflow_run_id"], "eval/chase/a/pass_at_3")
    stored = rows(
        workdir,
        "SELECT step, pass_at_k FROM eval_results WHERE data_source = 'chase/a' AND k = 3 "
        "ORDER BY step",
    )
    assert sorted((m.step, m.value) for m in history) == [
        (r["step"], pytest.approx(r["pass_at_k"])) for r in stored
    ]
