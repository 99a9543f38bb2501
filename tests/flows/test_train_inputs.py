"""The train flow on bad input: one clear error naming the culprit, nothing lost.

Unknown config key, missing model directory, dataset row without its answer, a prompt longer
than the model's context, a reward function that raises (scores 0, counted, the run goes on;
over data.reward_max_error_share it stops the run),
a second writer on the same workdir, and a resume whose configuration changed.
Run: `python -m pytest tests/flows/test_train_inputs.py -q`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparrow.config import ConfigError
from sparrow.data.datasets import DatasetError, PromptTooLongError
from sparrow.flows.train import train_flow
from sparrow.model import read_arch
from sparrow.model.builtin import ModelPathError, resolve_model_path
from sparrow.runtime.ledger.run_record import ConfigMismatchError
from sparrow.stages.reward import RewardErrorsError
from sparrow.storage import WorkdirBusyError, query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def raising_run(tmp_path_factory, flow_environment, small_overrides):
    """One step whose reward function raises on every sample (allowed: share 1)."""
    flow_environment.start()
    workdir = tmp_path_factory.mktemp("raising") / "work"
    summary = train_flow(
        small_overrides(
            workdir,
            "raise",
            "pipeline.steps=1",
            "data.reward=test_always_raises",
            "data.reward_max_error_share=1",
        ),
        show_table=False,
    )
    return workdir, summary


def test_unknown_config_key_is_named(tmp_path, small_overrides):
    workdir = tmp_path / "work"
    with pytest.raises(ConfigError, match="'pipeline.stepz'"):
        train_flow(small_overrides(workdir, "x", "pipeline.stepz=2"), show_table=False)
    assert not workdir.exists()


def test_missing_model_directory_is_named(tmp_path, small_overrides):
    workdir, missing = tmp_path / "work", tmp_path / "no-such-model"
    with pytest.raises(ModelPathError, match=str(missing)):
        train_flow(small_overrides(workdir, "x", f"model.path={missing}"), show_table=False)
    assert not workdir.exists()


def test_dataset_row_without_answer_is_named(tmp_path, small_overrides):
    data = write_jsonl(
        tmp_path / "train.jsonl",
        [{"prompt": "def ab=1\n", "answer": "1"}, {"prompt": "def cd=2\n", "solution": "2"}],
    )
    with pytest.raises(DatasetError, match=r"row 1 \(line 2\) has no 'answer' field"):
        train_flow(small_overrides(tmp_path / "work", "x", f"data.train={data}"), show_table=False)
    assert not (tmp_path / "work").exists()


def test_prompt_longer_than_the_context_is_named(tmp_path, small_overrides):
    context = read_arch(resolve_model_path("builtin:tiny")).max_position_embeddings
    data = write_jsonl(
        tmp_path / "train.jsonl",
        [{"prompt": "def ab=1\n", "answer": "1"}, {"prompt": "a" * (context + 5), "answer": "2"}],
    )
    with pytest.raises(
        PromptTooLongError,
        match=rf"row 1: the prompt is {context + 5} tokens "
        rf"but the model's context is {context} .*"
        rf"shorten or drop that row",
    ):
        train_flow(
            small_overrides(
                tmp_path / "work",
                "x",
                f"data.train={data}",
                f"data.max_prompt_tokens={2 * context}",
            ),
            show_table=False,
        )
    # refused before the workdir is touched: no `runs` row, the run id stays free
    assert not (tmp_path / "work").exists()


def test_raising_reward_function_scores_zero_and_is_counted(raising_run):
    workdir, summary = raising_run
    assert summary["status"] == "finished"
    rewards = pq.read_table(workdir / "runs/raise/step-1/reward/rewards.parquet")
    assert rewards.column("reward").to_pylist() == [0.0] * 4
    metrics = dict(
        query(
            workdir, "SELECT name, value FROM step_metrics WHERE step = 1 AND name LIKE 'reward/%'"
        ).rows
    )
    assert metrics["reward/errors"] == 4 and metrics["reward/mean"] == 0
    first = json.loads((workdir / "runs/raise/step-1/reward/summary.json").read_text())
    assert "this reward function always fails" in first["first_error"]


def test_a_reward_function_failing_on_most_samples_stops_the_run(
    tmp_path, flow_environment, small_overrides
):
    flow_environment.start()
    workdir = tmp_path / "work"
    with pytest.raises(RewardErrorsError) as err:
        train_flow(
            small_overrides(workdir, "stops", "pipeline.steps=1", "data.reward=test_always_raises"),
            show_table=False,
        )
    message = str(err.value)
    assert message.startswith("reward function 'test_always_raises' raised on 4 of 4 samples")
    assert "RuntimeError: this reward function always fails" in message
    assert "in always_raises" in message  # the traceback, down to the function
    recorded = query(workdir, "SELECT stage FROM stage_runs WHERE run_id = 'stops'").rows
    assert ("reward",) not in recorded and ("rollout",) in recorded


def test_second_writer_is_refused_and_nothing_is_lost(raising_run, small_overrides):
    workdir, _ = raising_run
    tables = ("runs", "stage_runs", "step_metrics", "bin_stats")
    before = {t: query(workdir, f"SELECT * FROM {t} ORDER BY ALL").rows for t in tables}
    files = {p: p.read_bytes() for p in (workdir / "runs").rglob("*") if p.is_file()}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from sparrow.storage import Store; "
            f"s = Store.open_writer({str(workdir)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirBusyError, match=rf"pid {holder.pid}"):
            train_flow(small_overrides(workdir, "second"), show_table=False)
        with pytest.raises(WorkdirBusyError):
            train_flow(
                small_overrides(
                    workdir,
                    "raise",
                    "pipeline.steps=1",
                    "data.reward=test_always_raises",
                    "data.reward_max_error_share=1",
                ),
                show_table=False,
            )
    finally:
        holder.communicate("")
    assert {t: query(workdir, f"SELECT * FROM {t} ORDER BY ALL").rows for t in tables} == before
    assert {p: p.read_bytes() for p in (workdir / "runs").rglob("*") if p.is_file()} == files
    assert not (workdir / "runs" / "second").exists()


def test_resume_with_another_config_names_the_keys(raising_run, small_overrides):
    workdir, _ = raising_run
    with pytest.raises(
        ConfigMismatchError,
        match=r"algo\.lr: 0\.0003 -> 2e-06.*"
        r"rollout\.temperature: 2\.0 -> 0\.5",
    ):
        train_flow(
            small_overrides(
                workdir,
                "raise",
                "pipeline.steps=1",
                "data.reward=test_always_raises",
                "data.reward_max_error_share=1",
                "algo.lr=2e-6",
                "rollout.temperature=0.5",
            ),
            show_table=False,
        )
    assert query(workdir, "SELECT status FROM runs WHERE run_id = 'raise'").rows == [("finished",)]
