"""scripts/study_seed.sh with stand-ins for `sparrow` and `nvidia-smi` on PATH: what it asks
the CLI for (the task and length of the study's YAML, the rule arms' selection, GPUs
round-robin over however many there are), without a GPU or a run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparrow.config.study import load_study

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "study_seed.sh"

FAKE_SPARROW = """#!/usr/bin/env bash
echo "GPU=${CUDA_VISIBLE_DEVICES:-none} $*" >> "$CALLS"
"""
FAKE_SMI = """#!/usr/bin/env bash
for i in $(seq 0 $((FAKE_GPUS - 1))); do echo "GPU $i: fake"; done
"""


def _run(
    tmp_path: Path, variant: str, gpus: int, model: str | None = "", **extra: str
) -> list[str]:
    """The CLI calls of one seed; model "" makes an empty model folder, None passes none."""
    if model == "":
        model = str(tmp_path / "model")
        Path(model).mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sparrow", FAKE_SPARROW), ("nvidia-smi", FAKE_SMI)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = os.environ | {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "FAKE_GPUS": str(gpus),
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "STUDY_MINUTES": "1",
        **extra,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), variant, "0"] + ([model] if model else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return calls.read_text().splitlines()


@pytest.mark.parametrize(("variant", "gpus"), [("v2", 4), ("v3", 2)])
def test_the_seed_asks_for_the_yamls_task_rule_and_every_gpu(tmp_path, variant, gpus):
    study = OmegaConf.to_container(
        OmegaConf.load(ROOT / f"sparrow/conf/study/study_{variant}.yaml")
    )
    common = dict(o.split("=", 1) for o in study["common"] if "=" in o)
    rule = next(
        o.split("=", 1)[1]
        for arm in study["arms"]
        for o in arm.get("overrides", [])
        if o.startswith("schedule.selection=")
    )
    calls = _run(tmp_path, variant, gpus)
    calibrations = [c for c in calls if " calibrate " in f" {c} "]
    assert len(calibrations) == 6
    for call in calibrations:
        assert f"data.train={common['data.train']}" in call
        assert f"rollout.max_new_tokens={common['rollout.max_new_tokens']}" in call
    rule_calls = [c for c in calibrations if "-rule-" in c]
    assert len(rule_calls) == 2 and all(f"schedule.selection={rule}" in c for c in rule_calls)
    used = {c.split()[0] for c in calibrations}
    assert used == {f"GPU={i}" for i in range(min(gpus, 4))}
    (run,) = [c for c in calls if " study run " in c]
    slots = ",".join(str(i % gpus) for i in range(9))
    assert f"--gpus {slots}" in run


def test_a_seed_split_over_holds_runs_and_calibrates_its_arms_only(tmp_path):
    calls = _run(tmp_path, "v2", 2, ARMS="dense,fixed,centroid-0.75,centroid-0.86,rule-0.86")
    calibrations = sorted(
        c.split("calibrate.name=")[1].split()[0] for c in calls if " calibrate " in f" {c} "
    )
    assert calibrations == ["v2-centroid-0.75", "v2-centroid-0.86", "v2-rule-0.86"]
    (run,) = [c for c in calls if " study run " in c]
    assert "--gpus 0,1,0,1,0" in run
    study = OmegaConf.load(tmp_path / "out" / "v2-s0" / "study.yaml")
    assert [a.name for a in study.arms] == [
        "dense",
        "fixed",
        "centroid-0.75",
        "centroid-0.86",
        "rule-0.86",
    ]


def test_a_hold_without_the_dense_arm_writes_a_study_the_cli_loads(tmp_path):
    _run(tmp_path, "v2", 1, ARMS="centroid-0.75,notis-0.75,rule-0.86")
    study = load_study(str(tmp_path / "out" / "v2-s0" / "study.yaml"))
    assert [a.name for a in study.arms] == ["centroid-0.75", "rule-0.86", "notis-0.75"]
    assert study.reference_arm == ""  # no collapse labels in this hold's report


def test_a_hold_with_the_dense_arm_keeps_it_as_the_reference(tmp_path):
    _run(tmp_path, "v2", 1, ARMS="dense,fixed")
    assert load_study(str(tmp_path / "out" / "v2-s0" / "study.yaml")).reference_arm == "dense"


def test_the_notis_arm_calibrates_the_schedule_it_shares(tmp_path):
    calls = _run(tmp_path, "v2", 2, ARMS="notis-0.75")
    (calibration,) = [c for c in calls if " calibrate " in f" {c} "]
    assert "calibrate.name=v2-centroid-0.75" in calibration
    assert "schedule.target=0.75" in calibration and "schedule.selection" not in calibration


def test_another_studys_file_runs_its_arms_on_the_variants_data(tmp_path):
    async_yaml = "sparrow/conf/study/study_v2_async.yaml"
    calls = _run(tmp_path, "v2", 1, STUDY_FILE=async_yaml)
    (calibration,) = [c for c in calls if " calibrate " in f" {c} "]
    assert (
        "calibrate.name=v2-centroid-0.86" in calibration and "schedule.target=0.86" in calibration
    )
    (run,) = [c for c in calls if " study run " in c]
    assert run.split(" study run ")[1].startswith("v2_async-s0 ") and "--gpus 0,0,0" in run
    study = OmegaConf.load(tmp_path / "out" / "v2_async-s0" / "study.yaml")
    staleness = {a.name: "pipeline.max_staleness=1" in a.overrides for a in study.arms}
    assert staleness == {"centroid-0.86": False, "async-0.86": True, "async-dense": True}


def test_a_missing_study_file_is_one_error_before_any_run(tmp_path):
    with pytest.raises(AssertionError, match="no study file"):
        _run(tmp_path, "v2", 1, STUDY_FILE="sparrow/conf/study/nothing.yaml")
    assert not (tmp_path / "calls.txt").exists()


def test_a_study_file_the_cli_would_refuse_stops_before_any_calibration(tmp_path):
    bad = OmegaConf.load(ROOT / "sparrow" / "conf" / "study" / "study_v2.yaml")
    bad.collapse_ratio = 1.5
    OmegaConf.save(bad, tmp_path / "bad.yaml")
    with pytest.raises(AssertionError, match="does not load: .*collapse_ratio must be in"):
        _run(tmp_path, "v2", 1, STUDY_FILE=str(tmp_path / "bad.yaml"), ARMS="dense")
    assert not (tmp_path / "calls.txt").exists()


def test_an_unknown_arm_is_one_error_that_names_it(tmp_path):
    with pytest.raises(AssertionError, match="centroid-0.5"):
        _run(tmp_path, "v2", 2, ARMS="dense,centroid-0.5")
    assert not (tmp_path / "calls.txt").exists()


def test_without_a_model_argument_the_kept_admitted_model_runs(tmp_path):
    calls = _run(tmp_path, "v3", 1, model=None, ARMS="dense")
    kept = ROOT / "models" / "testbed-v3-small"
    (run,) = [c for c in calls if " study run " in c]
    assert f"model.path={kept}" in run
    info = json.loads((kept / "training_info.json").read_text())
    record = json.loads((tmp_path / "out" / "v3-s0" / "model.json").read_text())
    assert record["model_safetensors_sha256"] == info["model_safetensors_sha256"]


def test_weights_other_than_training_infos_stop_the_seed_before_any_run(tmp_path):
    model = tmp_path / "changed"
    shutil.copytree(ROOT / "models" / "testbed-v2-small", model)
    data = bytearray((model / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    (model / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="training_info.json names"):
        _run(tmp_path, "v2", 1, model=str(model))
    assert not (tmp_path / "calls.txt").exists()


def test_gpu_ids_spread_the_calibrations_and_the_arms_over_those_gpus_only(tmp_path):
    calls = _run(tmp_path, "v3", 4, GPU_IDS="1,2,3")
    calibrations = [c for c in calls if " calibrate " in f" {c} "]
    assert {c.split()[0] for c in calibrations} == {"GPU=1", "GPU=2", "GPU=3"}
    (run,) = [c for c in calls if " study run " in c]
    assert "--gpus 1,2,3,1,2,3,1,2,3" in run


@pytest.mark.parametrize("ids", ["1,,2", "a", "1;2", "-1"])
def test_gpu_ids_other_than_gpu_numbers_are_one_error_before_any_run(tmp_path, ids):
    model = tmp_path / "model"
    model.mkdir()
    done = subprocess.run(
        ["bash", str(SCRIPT), "v2", "0", str(model)],
        cwd=ROOT,
        env=os.environ
        | {"GPU_IDS": ids, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "w")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2
        and f"GPU_IDS must be GPU numbers like 1,2,3, got '{ids}'" in done.stderr
    )
