"""The study flow end to end on the embedded model: two short arms, a forced failure in the
second, and a rerun of the same study id that skips the finished arm and resumes the other.

    python -m pytest tests/flows/test_study.py -q

Arm `dense` (dense rollout) and arm `fixed` (a flat schedule of 1 page per bin, controller
off), 2 steps each at test size. The first call fails on purpose in `fixed`'s step-2 rollout;
the second, with the same study id and no failure, must not run any of dense's stages or
fixed's step-1 stages again, and must end with both runs finished and the report written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparrow.cli.main import main
from sparrow.control.calibration import model_shape
from sparrow.costmodel import get_hardware, schedule_cost
from sparrow.flows.study import study_flow
from sparrow.model.builtin import resolve_model_path
from sparrow.runtime.ledger.stage import StageFailedOnPurpose
from sparrow.sparse import load_schedule_yaml
from sparrow.storage import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("flow_env"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning"),
]

STUDY = "st"


def study_file(path: Path, fail: bool) -> str:
    fixed = ["control.patience=1000000"] + (["pipeline.fail_at=rollout@2"] if fail else [])
    path.write_text(
        yaml.safe_dump(
            {
                "arms": [
                    {"name": "dense", "overrides": ["schedule.sparse=false"]},
                    {"name": "fixed", "overrides": fixed, "fixed_budget": True},
                ],
                "fixed_topk_pages": 1,
                "reference_arm": "dense",
                "collapse_window": 2,
            }
        )
    )
    return str(path)


def overrides(workdir: Path) -> list[str]:
    return [
        f"pipeline.workdir={workdir}",
        "pipeline.steps=2",
        "data.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=12",
        "rollout.temperature=2.0",
        "data.reward=test_char_code",
        "control.patience=3",
        "pipeline.report=false",
    ]


def stage_rows(workdir: Path) -> dict[tuple, tuple]:
    return {
        (r[0], r[1], r[2]): (r[3], r[4])
        for r in query(
            workdir, "SELECT run_id, step, stage, started_at, finished_at FROM stage_runs"
        ).rows
    }


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, flow_environment):
    flow_environment.start()
    root = tmp_path_factory.mktemp("study")
    workdir = root / "work"
    with pytest.raises(StageFailedOnPurpose, match="rollout failed on purpose at step 2"):
        study_flow(STUDY, study_file(root / "fail.yaml", True), overrides(workdir))
    before = stage_rows(workdir)
    summary = study_flow(STUDY, study_file(root / "study.yaml", False), overrides(workdir))
    return workdir, before, summary


def test_rerun_skips_the_finished_arm_and_resumes_the_failed_one(resumed):
    workdir, before, summary = resumed
    assert [(a["arm"], a["status"], a["skipped"], a["resumed"]) for a in summary["arms"]] == [
        ("dense", "finished", True, False),
        ("fixed", "finished", False, True),
    ]
    after = stage_rows(workdir)
    # every stage recorded before the rerun is the same record (not run again)
    assert {k: after[k] for k in before} == before
    assert {k for k in before if k[0] == "st-fixed"} == {
        ("st-fixed", 1, s)
        for s in (
            "rollout",
            "reward",
            "dense_score",
            "aggregate_mismatch",
            "reoptimize_schedule",
            "policy_update",
            "sync_weights",
        )
    }
    new = sorted((k[1], k[2]) for k in set(after) - set(before))
    assert all(k[0] == "st-fixed" for k in set(after) - set(before))
    assert new == sorted(
        (2, s)
        for s in (
            "rollout",
            "reward",
            "dense_score",
            "aggregate_mismatch",
            "reoptimize_schedule",
            "policy_update",
            "sync_weights",
            "checkpoint",
        )
    )
    runs = query(workdir, "SELECT run_id, status FROM runs ORDER BY run_id").rows
    assert runs == [("st-dense", "finished"), ("st-fixed", "finished")]


def test_arms_are_recorded_with_their_pinned_schedules(resumed):
    workdir, _, _ = resumed
    arms = query(
        workdir,
        "SELECT arm, run_id, overrides FROM study_arms WHERE study_id = 'st' ORDER BY arm_index",
    ).rows
    assert [(a, r) for a, r, _ in arms] == [("dense", "st-dense"), ("fixed", "st-fixed")]
    pinned = workdir / "studies" / "st" / "schedules" / "fixed.yaml"
    assert f"schedule.name={pinned}" in arms[1][2] and "pipeline.run_id=st-fixed" in arms[1][2]
    schedule = yaml.safe_load(pinned.read_text())
    assert schedule["name"] == "st-fixed" and set(schedule["topk_pages"]) == {1}
    budgets = query(
        workdir,
        "SELECT run_id, list(DISTINCT pages_read) FROM bin_stats GROUP BY run_id ORDER BY run_id",
    ).rows
    assert budgets == [("st-dense", [None]), ("st-fixed", [1 + 3])]  # + reserved_bos, _eos
    names = query(workdir, "SELECT DISTINCT run_id, schedule_name FROM bin_stats ORDER BY 1").rows
    assert names == [("st-dense", "st-dense"), ("st-fixed", "st-fixed")]


def test_the_report_is_written_from_duckdb(resumed, tmp_path, capsys):
    workdir, _, summary = resumed
    report = Path(summary["report"])
    written = json.loads((report / "summary.json").read_text())
    for name in ("reward.png", "p5_per_bin.png", "rollout_cost.png", "statistics.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rewards = dict(
        query(
            workdir,
            "SELECT run_id, avg(value) FROM step_metrics WHERE "
            "name = 'reward/mean' GROUP BY run_id",
        ).rows
    )
    by_arm = {a["arm"]: a for a in written["arms"]}
    assert by_arm["dense"]["final_reward"] == pytest.approx(rewards["st-dense"])
    assert by_arm["fixed"]["final_reward"] == pytest.approx(rewards["st-fixed"])
    assert by_arm["dense"]["collapsed"] is False and by_arm["dense"]["steps"] == 2
    assert by_arm["fixed"]["final_eval_accuracy"] is None  # no data.eval: reward only
    assert by_arm["dense"]["predicted_speedup"] == 1
    # the fixed arm priced by the cost model from its step metrics and pinned schedule
    metric = {
        (r[0], r[1]): r[2]
        for r in query(
            workdir, "SELECT step, name, value FROM step_metrics WHERE run_id = 'st-fixed'"
        ).rows
    }
    pinned = load_schedule_yaml(workdir / "studies" / "st" / "schedules" / "fixed.yaml")
    shape = model_shape(resolve_model_path("builtin:tiny"))
    priced = [
        schedule_cost(
            pinned,
            model=shape,
            hardware=get_hardware("h200"),
            prompt_len=round(metric[(s, "rollout/prompt_tokens_mean")]),
            gen_len=round(metric[(s, "response/length_mean")]),
            samples=2,
            scoring="pages",
        )
        for s in (1, 2)
    ]
    assert by_arm["fixed"]["predicted_speedup"] == pytest.approx(
        sum(c.dense.total for c in priced) / sum(c.sparse.total for c in priced)
    )
    # the same report again, by the command line, into another folder
    assert (
        main(["study", "report", "st", "--workdir", str(workdir), "--out", str(tmp_path), "--json"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["arms"] == json.loads(json.dumps(written["arms"]))
    assert (tmp_path / "summary.md").read_text().startswith("# Stability study `st`")


def _sparrow(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_arms_at_once_write_their_own_workdirs_and_one_report(tmp_path, flow_environment):
    """`--gpus` runs the two arms as two processes at once, each in its own workdir; the report
    reads both; a second call finds both finished and starts nothing. The command itself is a
    process of its own, reporting to the session's Prefect API as its arms do."""
    env, _ = flow_environment.subprocess_env(tmp_path / "prefect-home")
    workdir = tmp_path / "work"
    spec = str(tmp_path / "study.yaml")
    Path(spec).write_text(
        yaml.safe_dump(
            {
                "arms": [
                    {"name": "dense", "overrides": ["schedule.sparse=false"]},
                    {
                        "name": "fixed",
                        "overrides": ["control.patience=1000000"],
                        "fixed_budget": True,
                    },
                ],
                "fixed_topk_pages": 1,
                "reference_arm": "dense",
                "collapse_window": 1,
            }
        )
    )
    items = [
        "st2",
        "--study",
        spec,
        "--gpus",
        "0,1",
        "--json",
        "study.own_workdirs=true",
        f"pipeline.workdir={workdir}",
        "pipeline.steps=1",
        "data.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=8",
        "pipeline.report=false",
    ]
    done = _sparrow(env, "study", "run", *items)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert [(a["arm"], a["status"], a["skipped"]) for a in summary["arms"]] == [
        ("dense", "finished", False),
        ("fixed", "finished", False),
    ]
    assert sorted(a["gpu"] for a in summary["arms"]) == ["0", "1"]
    arms_dir = workdir / "studies" / "st2" / "arms"
    for arm in ("dense", "fixed"):
        assert query(arms_dir / arm, "SELECT run_id, status FROM runs").rows == [
            (f"st2-{arm}", "finished")
        ]
        assert (arms_dir / f"{arm}.log").is_file()
    # the study's own workdir holds the arms' rows, not their runs
    assert query(workdir, "SELECT count(*) FROM runs").rows == [(0,)]
    assert query(workdir, "SELECT arm FROM study_arms ORDER BY arm_index").rows == [
        ("dense",),
        ("fixed",),
    ]
    report = json.loads((Path(summary["report"]) / "summary.json").read_text())
    assert {a["arm"]: a["steps"] for a in report["arms"]} == {"dense": 1, "fixed": 1}
    pages = query(arms_dir / "fixed", "SELECT DISTINCT pages_read FROM bin_stats").rows
    assert pages == [(1 + 3,)]  # the pinned flat schedule, + reserved_bos, _eos
    # again: both finished, nothing started
    again = _sparrow(env, "study", "run", *items)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [(a["arm"], a["skipped"]) for a in json.loads(again.stdout)["arms"]] == [
        ("dense", True),
        ("fixed", True),
    ]


def test_arms_at_once_need_their_own_workdirs(tmp_path, capsys):
    assert main(["study", "run", "st3", "--gpus", "0,1", f"pipeline.workdir={tmp_path}"]) != 0
    assert "study.own_workdirs=true" in capsys.readouterr().err
    assert main(["study", "run", "st3", "--arm", "nosuch", f"pipeline.workdir={tmp_path}"]) != 0
    assert (
        "no arm 'nosuch' in the study; arms: dense, fixed, target-0.86" in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())  # refused before any workdir was made or process started
