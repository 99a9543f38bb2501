"""The configuration: composition, overrides, and one clear error per bad key or value."""

import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from sparrow.config import ConfigError, SparrowConfig, load_config, to_yaml
from sparrow.config.load import conf_dir, group_options
from sparrow.config.schema import GROUPS


def test_defaults_compose_to_the_schema_defaults():
    assert load_config() == SparrowConfig()


def test_overrides_set_typed_values():
    cfg = load_config(["algo.lr=2e-6", "rollout.samples_per_prompt=4", "schedule.sparse=false"])
    assert cfg.algo.lr == pytest.approx(2e-6)
    assert cfg.rollout.samples_per_prompt == 4
    assert cfg.schedule.sparse is False
    assert cfg.algo.eps_high == pytest.approx(0.28)  # untouched keys keep their defaults


def test_later_override_wins():
    assert load_config(["pipeline.steps=2", "pipeline.steps=7"]).pipeline.steps == 7


def test_unknown_key_names_the_key_and_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_config(["algo.eps_lo=0.1"])
    message = str(err.value)
    assert "'algo.eps_lo'" in message and "eps_low" in message and "eps_high" in message


def test_unknown_group_lists_groups():
    with pytest.raises(ConfigError, match="valid keys: model, rollout, schedule"):
        load_config(["modle.path=x"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'algo\.lr'.*abc"):
        load_config(["algo.lr=abc"])


def test_value_outside_choices_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"'algo\.loss_agg'.*token_mean, sequence_mean"):
        load_config(["algo.loss_agg=mean"])


def test_registry_names_are_checked():
    with pytest.raises(ConfigError, match=r"'algo\.advantage'.*grpo"):
        load_config(["algo.advantage=ppo"])


def test_range_checks():
    with pytest.raises(ConfigError, match=r"'rollout\.top_p'.*\(0, 1\]"):
        load_config(["rollout.top_p=1.5"])
    with pytest.raises(ConfigError, match="STAGE@STEP"):
        load_config(["pipeline.fail_at=rollout"])


def test_evaluation_samples_need_a_temperature_and_k_within_them():
    with pytest.raises(ConfigError, match=r"'pipeline\.eval_samples'.*eval_temperature > 0"):
        load_config(["pipeline.eval_samples=4"])
    with pytest.raises(
        ConfigError, match=r"'pipeline\.eval_pass_k'.*1\.\.pipeline\.eval_samples=4"
    ):
        load_config(
            [
                "pipeline.eval_samples=4",
                "pipeline.eval_temperature=0.6",
                "pipeline.eval_pass_k=[1,8]",
            ]
        )
    cfg = load_config(
        ["pipeline.eval_samples=4", "pipeline.eval_temperature=0.6", "pipeline.eval_pass_k=[1,4]"]
    )
    assert cfg.pipeline.eval_pass_k == [1, 4]


def test_malformed_override():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(["algo.lr"])


def test_group_choice_picks_a_file(tmp_path: Path):
    root = tmp_path / "conf"
    for group in GROUPS:
        (root / group).mkdir(parents=True)
        (root / group / "default.yaml").write_text("{}\n")
    (root / "config.yaml").write_text("defaults:\n  model: default\n")
    (root / "algo" / "fast.yaml").write_text("# faster learning\nlr: 3.0e-6\n")
    assert load_config(["algo=fast"], root=root).algo.lr == pytest.approx(3e-6)
    with pytest.raises(ConfigError, match="options: default, fast"):
        load_config(["algo=slow"], root=root)


def test_bad_key_in_a_yaml_file_names_the_file(tmp_path: Path):
    root = tmp_path / "conf"
    for group in GROUPS:
        (root / group).mkdir(parents=True)
        (root / group / "default.yaml").write_text("{}\n")
    (root / "config.yaml").write_text("defaults: {}\n")
    (root / "data" / "default.yaml").write_text("promt_key: text\n")
    with pytest.raises(ConfigError, match=r"'data\.promt_key'.*data/default\.yaml"):
        load_config(root=root)


def test_yaml_round_trip():
    cfg = load_config(["algo.lr=5e-6", "pipeline.run_id=abc"])
    dumped = to_yaml(cfg)
    assert "lr: 5.0e-06" in dumped and "run_id: abc" in dumped


def _leaf_paths(cls, prefix=""):
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            yield from _leaf_paths(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


@pytest.mark.parametrize("group", GROUPS)
def test_every_yaml_key_has_a_comment_and_every_field_is_listed(group):
    assert group_options(group), f"sparrow/conf/{group}/ has no YAML file"
    text = (conf_dir() / group / "default.yaml").read_text().splitlines()
    keys, stack = set(), []
    for i, line in enumerate(text):
        match = re.match(r"^(\s*)(\w+):", line)
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack = stack[:depth] + [match.group(2)]
        assert text[i - 1].strip().startswith("#"), (
            f"sparrow/conf/{group}: {line.strip()} lacks a comment"
        )
        keys.add(".".join(stack))
    schema_type = {f.name: f.default_factory for f in fields(SparrowConfig)}[group]
    expected = set(_leaf_paths(type(schema_type())))
    assert expected <= keys, f"sparrow/conf/{group}/default.yaml misses {sorted(expected - keys)}"


def test_vllm_backend_with_sparse_schedule_loads_where_vllm_is_importable(monkeypatch):
    import sparrow.vllm as backend

    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    cfg = load_config(["rollout.backend=vllm"])  # schedule.sparse is true by default
    assert (cfg.rollout.backend, cfg.schedule.sparse) == ("vllm", True)


def test_vllm_backend_without_vllm_names_the_package_and_the_install(monkeypatch):
    import sparrow.vllm as backend

    monkeypatch.setattr(
        backend.importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "vllm" else object(),
    )
    with pytest.raises(ConfigError) as err:
        load_config(["rollout.backend=vllm", "schedule.sparse=false"])
    message = str(err.value)
    assert "'vllm'" in message and "not importable" in message
    assert "docs/backends.md" in message and "scripts/pack_vllm.sh" in message


def test_vllm_backend_dense_loads_where_vllm_is_importable(monkeypatch):
    import sparrow.vllm as backend

    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    cfg = load_config(["rollout.backend=vllm", "schedule.sparse=false"])
    assert (cfg.rollout.backend, cfg.schedule.sparse) == ("vllm", False)


def test_unknown_backend_lists_native_and_vllm():
    with pytest.raises(ConfigError, match="allowed: native, vllm"):
        load_config(["rollout.backend=sglang"])


def test_schedule_selection_is_a_registry_name_and_dense_heads_are_pairs():
    cfg = load_config(["schedule.selection=quest_maxhead", "schedule.dense_heads=[[2,0],[5,3]]"])
    assert cfg.schedule.selection == "quest_maxhead"
    assert cfg.schedule.dense_heads == [[2, 0], [5, 3]]
    assert load_config([]).schedule.selection == "centroid"
    with pytest.raises(ConfigError, match="allowed: centroid, centroid_maxhead, oracle, quest"):
        load_config(["schedule.selection=nope"])
    with pytest.raises(ConfigError, match="schedule.dense_heads"):
        load_config(["schedule.dense_heads=[[2,0,1]]"])
    with pytest.raises(ConfigError, match="schedule.page_size"):
        load_config(["schedule.page_size=12"])


def test_the_qwen3_math_preset_composes_for_qwen3_on_the_shipped_set(qwen3_checkpoint):
    """The README's "Train your own model" groups: Qwen3's schedule and learning rate, the
    shipped math set evaluated with samples, and its prompts load through the model's own
    chat template (the random checkpoint's ChatML stands in for Qwen3's)."""
    from sparrow.data.run_prompts import configured_prompts
    from sparrow.model import load_tokenizer

    groups = ["model", "schedule", "rollout", "algo", "data", "pipeline"]
    cfg = load_config([f"{g}=qwen3_math" for g in groups] + [f"model.path={qwen3_checkpoint}"])
    assert cfg.schedule.name == "qwen3-1.7b-0.86" and cfg.algo.lr == 1e-6
    assert (cfg.data.train, cfg.data.eval, cfg.data.reward) == (
        "builtin:math-train",
        "builtin:math-test",
        "math",
    )
    assert cfg.pipeline.eval_samples > 1 and cfg.pipeline.eval_temperature > 0
    tokenizer = load_tokenizer(qwen3_checkpoint)
    for spec, rows in ((cfg.data.train, 400), (cfg.data.eval, 100)):
        data = configured_prompts(spec, cfg.data, qwen3_checkpoint, tokenizer)
        assert len(data) == rows
        assert data.row(0).prompt.startswith("<|im_start|>user\n")


def test_max_staleness_is_0_or_1_and_refuses_what_the_pipelined_flow_lacks():
    assert load_config().pipeline.max_staleness == 0
    assert load_config(["pipeline.max_staleness=1"]).pipeline.max_staleness == 1
    with pytest.raises(ConfigError, match="pipeline.max_staleness.*2.*0 \\(synchronous\\) or 1"):
        load_config(["pipeline.max_staleness=2"])
    for key in ("algo.dynamic_sampling=true", "algo.distill.enabled=true"):
        name = key.partition("=")[0]
        with pytest.raises(ConfigError, match=f"not run with {re.escape(name)}="):
            load_config(["pipeline.max_staleness=1", key])
        load_config([key])  # synchronous: allowed
    # a trainer group runs one-step-off, with the engines on its GPUs or on their own
    for placement in ("colocated", "separate"):
        group = ["trainer.num_workers=2", f"rollout.placement={placement}"]
        assert load_config(["pipeline.max_staleness=1", *group]).trainer.num_workers == 2
    with pytest.raises(ConfigError, match="keep_checkpoints' is 1.*0 or above 1"):
        load_config(["pipeline.max_staleness=1", "pipeline.keep_checkpoints=1"])
    load_config(["pipeline.max_staleness=1", "pipeline.keep_checkpoints=0"])


def test_finish_fraction_is_in_0_1_and_refuses_what_partial_rollouts_lack():
    assert load_config().rollout.finish_fraction == 1.0
    assert load_config(["rollout.finish_fraction=0.25"]).rollout.finish_fraction == 0.25
    for value in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"finish_fraction' is .*; it must be in \(0, 1\]"):
            load_config([f"rollout.finish_fraction={value}"])
    refused = (
        "pipeline.max_staleness=1",
        "algo.dynamic_sampling=true",
        "trainer.num_workers=2",
        "pipeline.keep_checkpoints=1",  # prunes the version of a carried sample's first tokens
    )
    for key in refused:
        name = key.partition("=")[0]
        with pytest.raises(
            ConfigError, match=f"partial rollouts do not run with {re.escape(name)}="
        ):
            load_config(["rollout.finish_fraction=0.5", key])
        load_config([key])  # waiting for every sample: allowed
    load_config(["rollout.finish_fraction=0.5", "pipeline.keep_checkpoints=0"])
