"""Run rows and versioned schedules: what a run starts with, what is in force at a step, and
the configuration check of a resume. No Prefect or Ray needed.

Run: `python -m pytest tests/runtime/ledger/test_run_state.py -q`.
"""

from __future__ import annotations

import dataclasses

import pytest

from sparrow.config import load_config
from sparrow.runtime.ledger.run_record import (
    ConfigMismatchError,
    config_differences,
    config_hash,
    finish_run,
    open_run,
)
from sparrow.runtime.ledger.schedules import insert_schedule, schedule_in_force, start_schedule
from sparrow.sparse import Schedule, get_preset
from sparrow.storage import Store, query


@pytest.fixture
def store(tmp_path):
    store = Store.open_writer(tmp_path)
    yield store
    store.close()


def test_first_run_stores_the_preset_as_version_1(store, tmp_path):
    assert start_schedule(store, "a", "tiny-0.86") == ("tiny-0.86", 1)
    assert start_schedule(store, "a", "tiny-0.86") == ("tiny-0.86", 1)  # resume: same answer
    [row] = query(
        tmp_path,
        "SELECT name, version, run_id, step, reason, topk_pages, bin_tokens FROM schedules",
    ).rows
    preset = get_preset("tiny-0.86")
    assert row == ("tiny-0.86", 1, "a", 0, "initial", list(preset.topk_pages), preset.bin_tokens)
    schedule, version = schedule_in_force(store, "a", "tiny-0.86", 1, step=1)
    assert (schedule, version) == (preset, 1)


def test_newer_versions_apply_from_the_next_step_of_their_run(store):
    start_schedule(store, "a", "tiny-0.86")
    wider = Schedule("tiny-0.86", topk_pages=(4, 5, 6), bin_tokens=128, skip_layers=(0,))
    with store.connect() as conn:
        insert_schedule(conn, wider, 2, "a", step=3, reason="reoptimized")
    assert schedule_in_force(store, "a", "tiny-0.86", 1, step=3)[1] == 1
    assert schedule_in_force(store, "a", "tiny-0.86", 1, step=4) == (wider, 2)
    # another run starts from the newest version; run "a" is not moved by that run's rows
    assert start_schedule(store, "b", "tiny-0.86") == ("tiny-0.86", 2)
    with store.connect() as conn:
        insert_schedule(conn, dataclasses.replace(wider, topk_pages=(5, 6, 7)), 3, "b", 1, "x")
    assert schedule_in_force(store, "a", "tiny-0.86", 1, step=9)[1] == 2
    assert schedule_in_force(store, "b", "tiny-0.86", 2, step=1)[1] == 2
    assert schedule_in_force(store, "b", "tiny-0.86", 2, step=2)[1] == 3


def test_open_run_creates_then_resumes_then_refuses_a_change(store, tmp_path):
    cfg = load_config(["pipeline.run_id=r", "algo.lr=2e-6"])
    assert open_run(store, cfg, "r", tmp_path / "model") is False
    finish_run(store, "r", "failed", "mlflow-1")
    # where it fails, how many steps, whether it reports and where Ray runs may change on resume
    same = load_config(
        [
            "pipeline.run_id=r",
            "algo.lr=2e-6",
            "pipeline.steps=9",
            "pipeline.fail_at=reward@2",
            "ray.address=auto",
            "ray.placement_strategy=strict_spread",
            "pipeline.report=false",
        ]
    )
    assert config_hash(same) == config_hash(cfg)
    assert open_run(store, same, "r", tmp_path / "model") is True
    assert query(tmp_path, "SELECT status, mlflow_run_id FROM runs").rows == [
        ("running", "mlflow-1")
    ]
    changed = load_config(["pipeline.run_id=r", "algo.lr=3e-6", "data.prompts_per_step=2"])
    assert config_hash(changed) != config_hash(cfg)
    with pytest.raises(ConfigMismatchError) as err:
        open_run(store, changed, "r", tmp_path / "model")
    message = str(err.value)
    assert "algo.lr: 2e-06 -> 3e-06" in message and "data.prompts_per_step: 8 -> 2" in message
    assert "pipeline.steps" not in message


def test_config_differences_lists_only_changed_keys():
    from sparrow.config import to_yaml

    cfg = load_config([])
    assert config_differences(to_yaml(cfg), cfg) == []
    other = load_config(["rollout.top_k=5", "schedule.sparse=false"])
    assert config_differences(to_yaml(cfg), other) == [
        "rollout.top_k: 0 -> 5",
        "schedule.sparse: True -> False",
    ]


def test_partial_rollouts_fix_the_number_of_actors():
    from sparrow.config import to_yaml

    # each actor closes on its own share of the groups: their number changes the batch
    cfg = load_config(["rollout.finish_fraction=0.5", "rollout.num_actors=2"])
    other = load_config(["rollout.finish_fraction=0.5", "rollout.num_actors=1"])
    assert config_differences(to_yaml(cfg), other) == ["rollout.num_actors: 2 -> 1"]
    assert config_hash(other) != config_hash(cfg)
    # a rollout that waits for every sample gives the same samples on any number of actors
    whole = load_config(["rollout.num_actors=2"])
    assert config_differences(to_yaml(whole), load_config(["rollout.num_actors=1"])) == []


def test_a_run_starts_with_its_configured_selection(tmp_path):
    """schedule.selection / dense_heads / page_size: the version a run starts with has them;
    a stored newest version without them is followed by one with them."""
    from sparrow.config.schema import ScheduleConfig

    store = Store.open_writer(tmp_path)
    plain = ScheduleConfig(name="tiny-0.86")
    quest = ScheduleConfig(name="tiny-0.86", selection="quest", dense_heads=[[1, 0]], page_size=4)
    assert start_schedule(store, "a", "tiny-0.86", plain) == ("tiny-0.86", 1)
    assert start_schedule(store, "b", "tiny-0.86", quest) == ("tiny-0.86", 2)
    assert start_schedule(store, "c", "tiny-0.86", quest) == ("tiny-0.86", 2)  # same: reused
    schedule, _ = schedule_in_force(store, "b", "tiny-0.86", 2, 1)
    assert (schedule.selection, schedule.dense_heads, schedule.page_size) == ("quest", ((1, 0),), 4)
    assert schedule.topk_pages[0] == 2 * get_preset("tiny-0.86").topk_pages[0]
    store.close()
