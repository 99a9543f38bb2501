"""Planning a study's arms (no flow runs): overrides in order, pinned schedules, the shared
start checked, finished arms found, study_arms rows written.

Run: `python -m pytest tests/stages/test_study_arms.py -q`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from sparrow.config import ConfigError
from sparrow.runtime.ledger.schedules import insert_schedule
from sparrow.sparse import get_preset, load_schedule_yaml
from sparrow.stages.study_arms import plan_study
from sparrow.storage import Store, query


def study(tmp_path, arms, **fields) -> str:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"arms": arms, "reference_arm": arms[0]["name"], **fields}))
    return str(path)


ARMS = [
    {"name": "dense", "overrides": ["schedule.sparse=false"]},
    {"name": "fixed", "overrides": ["control.patience=1000000"], "fixed_budget": True},
    {"name": "ctl", "overrides": ["schedule.target=0.9"]},
]


def test_plans_pin_each_arm_its_schedule_as_it_stood(tmp_path):
    workdir = tmp_path / "work"
    # another run's controller made version 2 of tiny-0.86 before the study started
    raised = replace(get_preset("tiny-0.86"), topk_pages=(8, 8, 16, 16, 20, 24, 28, 32))
    with Store.open_writer(workdir) as store, store.connect() as conn:
        insert_schedule(conn, get_preset("tiny-0.86"), 1, "other", 0, "initial")
        insert_schedule(conn, raised, 2, "other", 3, "bin 0 raise 4->8")
    common = [f"pipeline.workdir={workdir}", "pipeline.steps=2"]
    plans = plan_study("s1", study(tmp_path, ARMS, fixed_topk_pages=3), [], common)
    assert [(p["arm"], p["run_id"], p["finished"]) for p in plans] == [
        ("dense", "s1-dense", False),
        ("fixed", "s1-fixed", False),
        ("ctl", "s1-ctl", False),
    ]
    folder = workdir / "studies" / "s1" / "schedules"
    ctl = plans[2]["overrides"]
    assert ctl == [
        *common,
        "schedule.target=0.9",
        f"schedule.name={folder / 'ctl.yaml'}",
        "pipeline.run_id=s1-ctl",
    ]
    pinned = {arm: load_schedule_yaml(folder / f"{arm}.yaml") for arm in ("dense", "fixed", "ctl")}
    assert pinned["ctl"].name == "s1-ctl" and pinned["ctl"].target == 0.9
    assert pinned["ctl"].topk_pages == raised.topk_pages  # the newest stored version
    assert pinned["fixed"].topk_pages == (3,) * 8 and pinned["fixed"].page_size == 8
    rows = query(
        workdir, "SELECT arm, arm_index, run_id, overrides FROM study_arms ORDER BY arm_index"
    ).rows
    assert [r[:3] for r in rows] == [
        ("dense", 0, "s1-dense"),
        ("fixed", 1, "s1-fixed"),
        ("ctl", 2, "s1-ctl"),
    ]
    assert rows[2][3] == ctl
    # a later version of the schedule does not move an arm already planned
    with Store.open_writer(workdir) as store, store.connect() as conn:
        insert_schedule(conn, replace(raised, topk_pages=(30,) * 8), 3, "other", 4, "raise")
    plan_study("s1", study(tmp_path, ARMS, fixed_topk_pages=3), [], common)
    assert load_schedule_yaml(folder / "ctl.yaml") == pinned["ctl"]


def test_a_finished_arm_is_one_marked_finished_with_every_step(tmp_path):
    workdir = tmp_path / "work"
    common = [f"pipeline.workdir={workdir}", "pipeline.steps=2"]
    with Store.open_writer(workdir) as store, store.connect() as conn:
        conn.execute(
            "INSERT INTO runs (run_id, status) VALUES ('s-dense', 'finished'), "
            "('s-fixed', 'failed')"
        )
        for run_id, step in (("s-dense", 1), ("s-dense", 2), ("s-fixed", 1)):
            conn.execute(
                "INSERT INTO stage_runs (run_id, step, stage) VALUES (?, ?, 'sync_weights')",
                [run_id, step],
            )
    plans = plan_study("s", study(tmp_path, ARMS[:2]), [], common)
    assert [p["finished"] for p in plans] == [True, False]
    # more steps asked for: the finished arm is extended
    plans = plan_study("s", study(tmp_path, ARMS[:2]), [], [*common, "pipeline.steps=3"])
    assert [p["finished"] for p in plans] == [False, False]


@pytest.mark.parametrize(
    "arm_override, message",
    [
        ("pipeline.seed=3", "arm 'b' changes pipeline.seed"),
        ("model.path=/elsewhere", "arm 'b' changes model.path"),
        ("pipeline.run_id=x", "pipeline.run_id is set by the study"),
        ("no.such=1", "unknown config key"),
    ],
)
def test_arms_must_share_the_start(tmp_path, arm_override, message):
    arms = [{"name": "a"}, {"name": "b", "overrides": [arm_override]}]
    with pytest.raises(ConfigError, match=message):
        plan_study("s", study(tmp_path, arms), [], [f"pipeline.workdir={tmp_path / 'w'}"])
    assert not (tmp_path / "w").exists()  # refused before the workdir was touched
    with pytest.raises(ConfigError, match="study id 'a b'"):
        plan_study("a b", study(tmp_path, [{"name": "a"}]), [], [])
