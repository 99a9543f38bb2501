"""Renamed config keys: the old name still works, with a warning naming the new one; stored
configs and studies that hold the old name are read under the new one without a warning. Keys
moved to another group are refused, naming the new key; a run stored before the move resumes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from sparrow.config import SparrowConfig, load_config, to_yaml
from sparrow.config.renamed import RenamedKeyWarning
from sparrow.config.schema import GROUPS
from sparrow.config.study import load_study, study_from_yaml, study_yaml


def test_old_calibrate_key_on_the_command_line_sets_the_new_one():
    with pytest.warns(RenamedKeyWarning, match=r"'calibrate\.budgets'.*'calibrate\.topk_pages'"):
        cfg = load_config(["calibrate.budgets=[2,4]"])
    assert cfg.calibrate.topk_pages == [2, 4]


def test_old_key_in_a_group_file_is_read_and_the_new_one_wins(tmp_path: Path):
    root = tmp_path / "conf"
    for group in GROUPS:
        (root / group).mkdir(parents=True)
        (root / group / "default.yaml").write_text("{}\n")
    (root / "config.yaml").write_text("defaults: {}\n")
    (root / "calibrate" / "default.yaml").write_text("budgets: [3, 5]\n")
    with pytest.warns(RenamedKeyWarning, match="calibrate/default.yaml"):
        assert load_config(root=root).calibrate.topk_pages == [3, 5]
    (root / "calibrate" / "default.yaml").write_text("budgets: [3, 5]\ntopk_pages: [7]\n")
    with pytest.warns(RenamedKeyWarning):
        assert load_config(root=root).calibrate.topk_pages == [7]


def test_new_keys_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedKeyWarning)
        assert load_config(["calibrate.topk_pages=[2]"]).calibrate.topk_pages == [2]
        assert load_study("default", ["fixed_topk_pages=3"]).fixed_topk_pages == 3


def test_old_study_key_warns_and_a_stored_study_reads_quietly():
    with pytest.warns(RenamedKeyWarning, match="'fixed_topk_pages'"):
        assert load_study("default", ["fixed_budget_pages=3"]).fixed_topk_pages == 3
    stored = study_yaml(load_study("default")).replace("fixed_topk_pages", "fixed_budget_pages")
    assert "fixed_budget_pages: 2" in stored
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedKeyWarning)
        assert study_from_yaml(stored.replace(": 2", ": 6", 1)).fixed_topk_pages == 6


def test_a_run_stored_with_the_old_key_resumes_with_the_new_one():
    from sparrow.runtime.ledger.run_record import config_differences

    cfg = load_config(["calibrate.topk_pages=[2,4]"])
    assert to_yaml(cfg).count("topk_pages:") == 1
    stored = to_yaml(cfg).replace("topk_pages:", "budgets:")
    assert config_differences(stored, cfg) == []
    assert config_differences(to_yaml(SparrowConfig()), cfg) != []


def test_a_moved_key_is_refused_naming_its_new_name(tmp_path: Path):
    from sparrow.config.load import ConfigError

    with pytest.raises(ConfigError, match=r"'calibrate\.patience' is now 'control\.patience'"):
        load_config(["calibrate.patience=3"])
    root = tmp_path / "conf"
    for group in GROUPS:
        (root / group).mkdir(parents=True)
        (root / group / "default.yaml").write_text("{}\n")
    (root / "config.yaml").write_text("defaults: {}\n")
    (root / "calibrate" / "default.yaml").write_text("margin: 0.1\n")
    with pytest.raises(ConfigError, match=r"calibrate/default.yaml.*'control\.margin'"):
        load_config(root=root)
    assert load_config(["control.patience=3"]).control.patience == 3


def test_a_run_stored_before_the_move_resumes():
    import yaml

    from sparrow.runtime.ledger.run_record import config_differences

    cfg = load_config(["control.patience=3"])
    stored = yaml.safe_load(to_yaml(cfg))
    stored["control"].pop("confirm_raise")  # a key added after the move
    stored["calibrate"].update(stored.pop("control"))  # as a run stored before the move
    assert config_differences(yaml.safe_dump(stored), cfg) == []
    stored["calibrate"]["patience"] = 5
    assert config_differences(yaml.safe_dump(stored), cfg) == ["control.patience: 5 -> 3"]


TRAINER_KEYS = (
    "micro_batch_tokens",
    "logits_chunk_tokens",
    "gradient_checkpointing",
    "offload_during_rollout",
    "master_weights",
    "fused_norms",
    "compile_layers",
    "compile_logprobs",
)


@pytest.mark.parametrize("key", TRAINER_KEYS)
def test_the_trainer_system_keys_moved_from_algo_to_trainer(key: str):
    from sparrow.config.load import ConfigError

    with pytest.raises(
        ConfigError, match=rf"^config keys moved .*'algo\.{key}' is now 'trainer\.{key}'"
    ):
        load_config([f"algo.{key}=1"])
    assert not hasattr(load_config().algo, key) and hasattr(load_config().trainer, key)


def test_a_run_stored_with_the_trainer_keys_under_algo_resumes():
    import yaml

    from sparrow.runtime.ledger.run_record import config_differences

    cfg = load_config(["trainer.micro_batch_tokens=512", "trainer.gradient_checkpointing=true"])
    stored = yaml.safe_load(to_yaml(cfg))
    for key in TRAINER_KEYS:  # as a run stored before the move
        stored["algo"][key] = stored["trainer"].pop(key)
    assert config_differences(yaml.safe_dump(stored), cfg) == []
    stored["algo"]["micro_batch_tokens"] = 1024
    assert config_differences(yaml.safe_dump(stored), cfg) == [
        "trainer.micro_batch_tokens: 1024 -> 512"
    ]
