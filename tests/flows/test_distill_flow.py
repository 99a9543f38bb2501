"""`sparrow train algo.distill.enabled=true` end to end on the embedded tiny model: the
distill_lora stage runs between policy_update and sync, its metrics reach DuckDB and MLflow,
the engines are handed its adapter, checkpoints keep it, and a run failed on purpose in the
stage resumes to the same adapter, optimizer state and metrics as the uninterrupted run.
Run: `python -m pytest tests/flows/test_distill_flow.py -q` (slow: three short flows).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparrow.flows.train import train_flow
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

DISTILL = (
    "algo.distill.enabled=true",
    "algo.lr=1e-6",
    "algo.distill.lr_scale=1000",
    "pipeline.eval_every=0",
    "algo.distill.switch_to_cheaper=true",
    "algo.distill.switch_patience=1",
)
TIMING = ("time/", "rollout/tokens_per_s")


def stage_dir(workdir: Path, run_id: str, step: int, stage: str) -> Path:
    return workdir / "runs" / run_id / f"step-{step}" / stage


def metrics_of(workdir: Path, run_id: str) -> dict[tuple[int, str], float]:
    rows = query(
        workdir, "SELECT step, name, value FROM step_metrics WHERE run_id = ?", [run_id]
    ).as_dicts()
    return {(r["step"], r["name"]): r["value"] for r in rows if not r["name"].startswith(TIMING)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, flow_environment, small_overrides):
    flow_environment.start()
    workdir = tmp_path_factory.mktemp("distill") / "work"
    summary = train_flow(small_overrides(workdir, "ref", *DISTILL), show_table=False)
    return workdir, summary


def test_stage_runs_and_records_its_metrics(reference):
    from mlflow.tracking import MlflowClient

    workdir, summary = reference
    assert summary["status"] == "finished"
    assert summary["stages_run"]["distill_lora"] == 2
    metrics = metrics_of(workdir, "ref")
    for step in (1, 2):
        for name in (
            "distill/loss",
            "distill/k3",
            "distill/p5_lora",
            "distill/p5_base",
            "distill/min_bin_p5_lora",
            "distill/min_bin_p5_base",
        ):
            assert math.isfinite(metrics[(step, name)]), (step, name)
        assert 0 <= metrics[(step, "distill/p5_lora")] <= 1
    # a fresh adapter is the base: with and without it, the same acceptance at step 1
    assert metrics[(1, "distill/p5_lora")] == pytest.approx(metrics[(1, "distill/p5_base")])
    # the switch: step 1 measured the LoRA one notch cheaper; step 2's controller decided
    measured = json.loads(
        (stage_dir(workdir, "ref", 1, "distill_lora") / "cheaper.json").read_text()
    )
    assert measured["values"] and measured["cheaper_topk"] != measured["schedule_topk"]
    assert min(measured["values"].values()) == pytest.approx(
        metrics[(1, "distill/min_bin_p5_cheaper")]
    )
    switched = metrics[(2, "reoptimize/distill_switch")]
    if metrics[(2, "mismatch/bins_below")] == 0:  # no raise due: the rule alone decides
        assert switched == float(min(measured["values"].values()) >= 0.86)
    events = query(
        workdir,
        "SELECT count(*) AS n FROM threshold_events WHERE kind = 'distill_switch' AND step = 2",
        [],
    ).as_dicts()[0]["n"]
    assert (events > 0) == (switched == 1.0)
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir.resolve()}/mlflow.db")
    history = client.get_metric_history(summary["mlflow_run_id"], "distill/loss")
    assert [(m.step, m.value) for m in history] == [
        (s, pytest.approx(metrics[(s, "distill/loss")])) for s in (1, 2)
    ]


def test_engines_get_the_adapter_and_checkpoints_keep_it(reference):
    workdir, _ = reference
    adapters = [
        load_file(str(stage_dir(workdir, "ref", s, "distill_lora") / "adapter.safetensors"))
        for s in (1, 2)
    ]
    assert any(not torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    for step in (1, 2):
        synced = json.loads(
            (stage_dir(workdir, "ref", step, "sync_weights") / "synced.json").read_text()
        )
        assert synced["adapter_path"] == str(stage_dir(workdir, "ref", step, "distill_lora"))
    kept = load_file(
        str(workdir / "runs" / "ref" / "checkpoints" / "step-2" / "distill" / "adapter.safetensors")
    )
    assert all(torch.equal(kept[k], adapters[1][k]) for k in kept)


def test_fail_in_the_stage_then_resume_ends_equal(reference, tmp_path, small_overrides):
    ref_workdir, _ = reference
    workdir = tmp_path / "work"
    with pytest.raises(StageFailedOnPurpose, match="distill_lora.*step 2"):
        train_flow(
            small_overrides(workdir, "r", *DISTILL, "pipeline.fail_at=distill_lora@2"),
            show_table=False,
        )
    assert not stage_dir(workdir, "r", 2, "distill_lora").exists()
    summary = train_flow(small_overrides(workdir, "r", *DISTILL), show_table=False)
    assert summary["resumed"] and summary["status"] == "finished"
    assert summary["stages_run"] == {"distill_lora": 1, "sync_weights": 1, "checkpoint": 1}
    resumed, uninterrupted = metrics_of(workdir, "r"), metrics_of(ref_workdir, "ref")
    assert resumed.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        assert resumed[key] == value or (math.isnan(value) and math.isnan(resumed[key])), key
    for name in ("adapter.safetensors",):
        ours = load_file(str(stage_dir(workdir, "r", 2, "distill_lora") / name))
        theirs = load_file(str(stage_dir(ref_workdir, "ref", 2, "distill_lora") / name))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    ours = torch.load(stage_dir(workdir, "r", 2, "distill_lora") / "distill_optimizer.pt")
    theirs = torch.load(stage_dir(ref_workdir, "ref", 2, "distill_lora") / "distill_optimizer.pt")
    for index, state in theirs["state"].items():
        assert all(torch.equal(state[k], ours["state"][index][k]) for k in state)
