"""Compose, override and validate the configuration.

    cfg = load_config(["model.path=/models/Qwen3-1.7B", "schedule=sparse", "algo.lr=2e-6"])

Order: schema defaults, then sparrow/conf/config.yaml's `defaults` (one YAML file per group), then
`group=name` choices and `key=value` overrides in the order given. Any unknown key, value of
the wrong type, or value outside its allowed set is one ConfigError naming the key and what
it accepts; nothing runs before the whole config is valid.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from sparrow.config.renamed import (
    CONFIG_RENAMES,
    moved_in,
    moved_in_overrides,
    rename_keys,
    rename_overrides,
)
from sparrow.config.schema import CHOICES, GROUPS, SparrowConfig
from sparrow.errors import SparrowError


class ConfigError(SparrowError, ValueError):
    """A configuration problem; the message names the key and what it accepts."""


def conf_dir() -> Path:
    """The sparrow/conf/ folder: $SPARROW_CONF_DIR, else the one installed with the package."""
    override = os.environ.get("SPARROW_CONF_DIR")
    if override:
        return Path(override)
    return Path(str(resources.files("sparrow"))) / "conf"


def group_options(group: str, root: Path | None = None) -> list[str]:
    folder = (root or conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_config(overrides: Iterable[str] = (), root: Path | None = None) -> SparrowConfig:
    root = root or conf_dir()
    overrides = list(overrides)
    choices, dotlist = _split_overrides(overrides, root)
    merged = OmegaConf.structured(SparrowConfig)
    for group in GROUPS:
        path = root / group / f"{choices[group]}.yaml"
        data = rename_keys({group: _read_yaml(path)}, CONFIG_RENAMES, source=str(path))
        _refuse_moved(moved_in(data), str(path))
        merged = _merge(merged, data, source=str(path))
    _refuse_moved(moved_in_overrides(dotlist), "command line")
    dotlist = rename_overrides(dotlist, CONFIG_RENAMES)
    merged = _merge(merged, OmegaConf.from_dotlist(dotlist), source="command line")
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, SparrowConfig)
    validate(cfg)
    return cfg


def _refuse_moved(moved: list[tuple[str, str]], source: str) -> None:
    if moved:
        named = ", ".join(f"{old!r} is now {new!r}" for old, new in moved)
        raise ConfigError(
            f"config keys moved (from {source}): {named}; set the new name"
            " (docs/configuration.md, 'Renamed keys')"
        )


def to_yaml(cfg: SparrowConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _split_overrides(overrides: list[str], root: Path) -> tuple[dict[str, str], list[str]]:
    defaults = _read_yaml(root / "config.yaml").get("defaults", {})
    choices = {group: str(defaults.get(group, "default")) for group in GROUPS}
    dotlist = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        if key in GROUPS:
            options = group_options(key, root)
            if value not in options:
                raise ConfigError(
                    f"config group {key!r} has no option {value!r}; options: {', '.join(options)}"
                    f" (a single field is set as {key}.FIELD=VALUE)"
                )
            choices[key] = value
        else:
            dotlist.append(item)
    return choices, dotlist


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except OmegaConfBaseException as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    return data or {}


def _merge(base, update, source: str):
    try:
        return OmegaConf.merge(base, update)
    except ConfigKeyError as err:
        key = err.full_key or str(err.key)
        parent = key.rpartition(".")[0]
        raise ConfigError(
            f"unknown config key {key!r} (from {source}); "
            f"valid keys{' under ' + repr(parent) if parent else ''}: {', '.join(_keys_at(parent))}"
        ) from None
    except ValidationError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"config key {err.full_key!r} (from {source}): {first_line}") from None


def _keys_at(dotted: str) -> list[str]:
    node = SparrowConfig
    for part in filter(None, dotted.split(".")):
        node = next((f.type for f in fields(node) if f.name == part), None)
        if isinstance(node, str):
            node = _resolve_type(node)
        if node is None or not is_dataclass(node):
            return []
    return [f.name for f in fields(node)]


def _resolve_type(name: str):
    from sparrow.config import schema

    return getattr(schema, name, None)


def _get(cfg: SparrowConfig, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def validate(cfg: SparrowConfig) -> None:
    """Check closed choices, registry names and ranges; raise ConfigError on the first miss."""
    for key, allowed in {**CHOICES, **_registry_choices()}.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"config key {key!r} is {value!r}; allowed: {', '.join(allowed)}")
    for key, ok, rule in _RANGES:
        if not ok(_get(cfg, key)):
            raise ConfigError(f"config key {key!r} is {_get(cfg, key)!r}; it must be {rule}")
    _check_reward(cfg.data.reward)
    for pattern, name in cfg.data.reward_by_source.items():
        _check_reward(name, f"data.reward_by_source.{pattern}")
    if cfg.data.chat_template not in ("auto", "none"):
        from sparrow.data.chat import ChatTemplateError, template_path

        try:
            template_path(cfg.data.chat_template)
        except ChatTemplateError as err:
            raise ConfigError(f"config key {err}") from None
    _check_backend(cfg)
    _check_eval(cfg.pipeline)
    _check_staleness(cfg)
    _check_partial(cfg)
    for key in ("fail_at", "kill_at"):
        spec = getattr(cfg.pipeline, key)
        stage, sep, step = spec.partition("@")
        if spec and (not sep or not stage or not step.isdigit()):
            raise ConfigError(f"config key 'pipeline.{key}' is {spec!r}; it must be STAGE@STEP")


def _check_staleness(cfg: SparrowConfig) -> None:
    """pipeline.max_staleness=1 with what the pipelined flow does not carry yet, or with
    retention that would prune the older policy a resumed rollout starts from."""
    staleness = cfg.pipeline.max_staleness
    if not staleness:
        return
    refused = {
        "algo.dynamic_sampling": cfg.algo.dynamic_sampling,
        "algo.distill.enabled": cfg.algo.distill.enabled,
    }
    for key, on in refused.items():
        if on:
            raise ConfigError(
                f"config key 'pipeline.max_staleness' is {staleness}; the one-step-off flow does "
                f"not run with {key}={_get(cfg, key)} yet (docs/async.md): set one of them back"
            )
    keep = cfg.pipeline.keep_checkpoints
    if 0 < keep <= staleness:
        raise ConfigError(
            f"config key 'pipeline.keep_checkpoints' is {keep}; with pipeline.max_staleness="
            f"{staleness} it must be 0 or above {staleness}: a resumed rollout starts from the "
            f"policy {staleness + 1} updates back"
        )


def _check_partial(cfg: SparrowConfig) -> None:
    """rollout.finish_fraction < 1 (partial rollouts, docs/async.md) with what it does not
    carry yet, or with retention that would prune the version a carried token came from."""
    fraction = cfg.rollout.finish_fraction
    if fraction >= 1:
        return
    refused = {
        "pipeline.max_staleness": cfg.pipeline.max_staleness > 0,
        "algo.dynamic_sampling": cfg.algo.dynamic_sampling,
        "trainer.num_workers": cfg.trainer.num_workers > 0,
        "rollout.backend": cfg.rollout.backend != "native",
        "pipeline.keep_checkpoints": cfg.pipeline.keep_checkpoints == 1,
    }
    for key, on in refused.items():
        if on:
            raise ConfigError(
                f"config key 'rollout.finish_fraction' is {fraction}; partial rollouts do not "
                f"run with {key}={_get(cfg, key)} (docs/async.md): set one of them back"
            )


def _check_reward(name: str, key: str = "data.reward") -> None:
    """data.reward: a registry name, module:function or file.py:function that loads."""
    from sparrow.data.reward_spec import RewardSpecError, load_reward

    try:
        function = load_reward(name)
    except RewardSpecError as err:
        raise ConfigError(f"config key {key!r}: {err}") from None
    preflight = getattr(function, "preflight", None)
    if callable(preflight):
        try:
            preflight()  # the code reward: bwrap must be installed before a run starts
        except Exception as err:
            raise ConfigError(f"config key {key!r}: {name!r} cannot run here: {err}") from None


def _check_eval(pipeline) -> None:
    """n greedy samples of a prompt are one answer n times; pass@k needs k <= n."""
    n = pipeline.eval_samples
    if n > 1 and pipeline.eval_temperature == 0:
        raise ConfigError(
            f"config key 'pipeline.eval_samples' is {n} but pipeline.eval_temperature is 0: "
            f"greedy samples of a prompt are all the same; set pipeline.eval_temperature > 0 "
            f"(e.g. 0.6) or pipeline.eval_samples=1"
        )
    bad = [k for k in pipeline.eval_pass_k if not 1 <= k <= n]
    if bad:
        raise ConfigError(
            f"config key 'pipeline.eval_pass_k' is {list(pipeline.eval_pass_k)!r}; each k must "
            f"be in 1..pipeline.eval_samples={n}"
        )


def _check_backend(cfg: SparrowConfig) -> None:
    """rollout.backend=vllm: vllm importable here (not imported). With schedule.sparse the
    actors start vLLM with the project's block-sparse backend (docs/backends.md)."""
    if cfg.rollout.backend != "vllm":
        return
    from sparrow.vllm import INSTALL_HINT, vllm_available

    if not vllm_available():
        raise ConfigError(
            f"config key 'rollout.backend' is 'vllm' but the package 'vllm' is not "
            f"importable here; {INSTALL_HINT}, or set rollout.backend=native"
        )


def _registry_choices() -> dict[str, tuple[str, ...]]:
    from sparrow.costmodel.presets import HARDWARE
    from sparrow.rl import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
    from sparrow.sparse.scoring import SCORING_RULES
    from sparrow.sparse.target import TARGET_STATISTICS

    return {
        "algo.advantage": tuple(ADVANTAGE_ESTIMATORS.names()),
        "algo.loss": tuple(POLICY_LOSSES.names()),
        "schedule.target_statistic": tuple(TARGET_STATISTICS.names()),
        "schedule.selection": tuple(SCORING_RULES.names()),
        "calibrate.hardware": tuple(HARDWARE),
    }


_RANGES = [
    ("rollout.samples_per_prompt", lambda v: v >= 1, ">= 1"),
    ("rollout.max_new_tokens", lambda v: v >= 1, ">= 1"),
    ("rollout.temperature", lambda v: v >= 0, ">= 0 (0 is greedy)"),
    ("pipeline.eval_temperature", lambda v: v >= 0, ">= 0 (0 is greedy)"),
    ("pipeline.eval_samples", lambda v: v >= 1, ">= 1"),
    ("pipeline.eval_prompts", lambda v: v >= 0, ">= 0 (0: every row of a file)"),
    ("pipeline.max_staleness", lambda v: v in (0, 1), "0 (synchronous) or 1 (one-step-off)"),
    ("rollout.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("rollout.finish_fraction", lambda v: 0 < v <= 1, "in (0, 1] (1 waits for every sample)"),
    ("rollout.top_k", lambda v: v >= 0, ">= 0 (0 keeps all)"),
    ("rollout.logprobs_topk", lambda v: v >= 1, ">= 1"),
    ("rollout.kv_cache_mib", lambda v: v >= 1, ">= 1"),
    ("rollout.gpu_memory_utilization", lambda v: 0 <= v < 1, "in [0, 1) (0 uses kv_cache_mib)"),
    ("rollout.max_batch_size", lambda v: v >= 1, ">= 1"),
    ("rollout.num_actors", lambda v: v >= 0, ">= 0 (0 is automatic)"),
    ("rollout.work_item_prompts", lambda v: v >= 0, ">= 0 (0 is automatic)"),
    ("trainer.num_workers", lambda v: v >= 0, ">= 0 (0 trains in the flow's process)"),
    ("trainer.sync_bucket_mib", lambda v: v >= 1, ">= 1"),
    ("trainer.micro_batch_tokens", lambda v: v >= 1, ">= 1"),
    ("trainer.logits_chunk_tokens", lambda v: v >= 1, ">= 1"),
    ("schedule.target", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("schedule.page_size", lambda v: v >= 0 and v & (v - 1) == 0, "0 or a power of two"),
    (
        "schedule.dense_heads",
        lambda v: all(len(pair) == 2 and min(pair) >= 0 for pair in v),
        "a list of [layer, KV head] pairs >= 0",
    ),
    ("algo.eps_low", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("algo.eps_high", lambda v: v >= 0, ">= 0"),
    ("algo.lr", lambda v: v > 0, "> 0"),
    ("algo.grad_clip", lambda v: v >= 0, ">= 0 (0 disables)"),
    ("algo.ppo_epochs", lambda v: v >= 1, ">= 1"),
    ("algo.distill.lora_rank", lambda v: v >= 1, ">= 1"),
    ("algo.distill.lora_alpha", lambda v: v > 0, "> 0"),
    ("algo.distill.kl_coef", lambda v: v >= 0, ">= 0"),
    ("algo.distill.ppo_coef", lambda v: v >= 0, ">= 0 (0 turns the PPO term off)"),
    ("algo.distill.lr_scale", lambda v: v > 0, "> 0"),
    ("algo.distill.every", lambda v: v >= 1, ">= 1"),
    ("algo.distill.switch_patience", lambda v: v >= 1, ">= 1"),
    ("algo.distill.selector_coef", lambda v: v >= 0, ">= 0 (0 turns the selector term off)"),
    ("algo.distill.selector_positions", lambda v: v >= 1, ">= 1"),
    ("algo.distill.switch_margin", lambda v: 0 <= v < 1, "in [0, 1)"),
    (
        "algo.distill.targets",
        lambda v: (
            len(v) > 0
            and set(v)
            <= {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
        ),
        "a non-empty list of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
    ),
    ("data.prompts_per_step", lambda v: v >= 1, ">= 1"),
    ("algo.dynamic_sampling_max_draws", lambda v: v >= 1, ">= 1"),
    ("algo.overlong_buffer", lambda v: v >= 0, ">= 0 (0 turns the shaping off)"),
    ("algo.overlong_penalty", lambda v: v >= 0, ">= 0"),
    ("data.max_prompt_tokens", lambda v: v >= 1, ">= 1"),
    ("data.reward_timeout_s", lambda v: v > 0, "> 0"),
    ("data.reward_max_error_share", lambda v: 0 <= v <= 1, "in [0, 1] (1 never stops)"),
    ("pipeline.steps", lambda v: v >= 0, ">= 0"),
    ("pipeline.keep_checkpoints", lambda v: v >= 0, ">= 0 (0 keeps every step's)"),
    ("pipeline.keep_every", lambda v: v >= 0, ">= 0 (0: none beyond keep_checkpoints)"),
    ("calibrate.num_prompts", lambda v: v >= 1, ">= 1"),
    ("calibrate.repeats", lambda v: v >= 1, ">= 1"),
    ("calibrate.max_new_tokens", lambda v: v >= 0, ">= 0 (0 takes rollout.max_new_tokens)"),
    (
        "calibrate.topk_pages",
        lambda v: all(b >= 1 for b in v) and list(v) == sorted(set(v)),
        "a strictly increasing list of page counts >= 1 (empty picks a grid)",
    ),
    ("calibrate.min_bin_tokens", lambda v: v >= 1, ">= 1"),
    ("calibrate.min_bin_samples", lambda v: v >= 1, ">= 1"),
    ("calibrate.num_bins", lambda v: v >= 0, ">= 0 (0 keeps the schedule's)"),
    ("control.tolerance", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("control.patience", lambda v: v >= 1, ">= 1"),
    ("control.margin", lambda v: 0 <= v < 1, "in [0, 1)"),
]
