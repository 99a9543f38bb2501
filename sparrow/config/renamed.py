"""Config keys that were renamed or moved to another group.

    data = rename_keys(data, CONFIG_RENAMES, source="sparrow/conf/calibrate/my.yaml")   # nested dict
    dotlist = rename_overrides(["calibrate.budgets=[4,8]"], CONFIG_RENAMES)    # key=value items
    moved_in(data) or moved_in_overrides(dotlist)   # [(old, new)]: config.load refuses them
    data = move_keys(stored, MOVED_KEYS)            # a stored run config, read quietly

A renamed key (CONFIG_RENAMES) is still read, with a warning naming the new one. A moved key
(MOVED_KEYS: the keys were grouped by concern) is refused in a user's YAML file or override
with one error naming the new key; a run's stored configuration, which a user cannot change,
is read under the new names without a word.

docs/glossary.md says why the names changed (one number, one name: topk_pages are the pages
chosen by score, pages_read adds the reserved ones).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

# old dotted key -> new dotted key, in the train config and in a study's YAML
CONFIG_RENAMES = {
    "calibrate.budgets": "calibrate.topk_pages",
    # issue 36: one floor for calibration, the controller and the reports
    "calibrate.min_tokens": "calibrate.min_bin_tokens",
}
STUDY_RENAMES = {"fixed_budget_pages": "fixed_topk_pages"}
# old dotted key -> new dotted key in another group
MOVED_KEYS = {
    "calibrate.tolerance": "control.tolerance",
    "calibrate.patience": "control.patience",
    "calibrate.margin": "control.margin",
    "calibrate.remeasure_samples": "control.remeasure_samples",
    # the trainer system's knobs, with the trainer
    "algo.micro_batch_tokens": "trainer.micro_batch_tokens",
    "algo.logits_chunk_tokens": "trainer.logits_chunk_tokens",
    "algo.gradient_checkpointing": "trainer.gradient_checkpointing",
    "algo.offload_during_rollout": "trainer.offload_during_rollout",
    "algo.master_weights": "trainer.master_weights",
    "algo.fused_norms": "trainer.fused_norms",
    "algo.compile_layers": "trainer.compile_layers",
    "algo.compile_logprobs": "trainer.compile_logprobs",
}


class RenamedKeyWarning(DeprecationWarning):
    """A config key given by its old name."""


def _warn(old: str, new: str, source: str) -> None:
    warnings.warn(
        f"config key {old!r} (from {source}) is deprecated: it is now {new!r}",
        RenamedKeyWarning,
        stacklevel=4,
    )


def rename_keys(
    data: dict, renames: dict[str, str], source: str, prefix: str = "", warn: bool = True
) -> dict:
    """A copy of nested `data` with every old key moved to its new name (the new one wins
    when both are given). warn=False for stored data a user cannot change (a run's config)."""
    out = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            value = rename_keys(value, renames, source, f"{dotted}.", warn)
        new = renames.get(dotted)
        if new is None:
            out[key] = value
            continue
        if warn:
            _warn(dotted, new, source)
        out.setdefault(new.rpartition(".")[2], value)
    return out


def rename_overrides(
    items: Iterable[str], renames: dict[str, str], source: str = "command line"
) -> list[str]:
    """`key=value` items with an old key written under its new name."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key in renames:
            _warn(key, renames[key], source)
            item = f"{renames[key]}={value}"
        out.append(item)
    return out


def _flat(data: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        out += _flat(value, f"{dotted}.") if isinstance(value, dict) else [dotted]
    return out


def moved_in(data: dict, moves: dict[str, str] = MOVED_KEYS) -> list[tuple[str, str]]:
    """(old, new) for every moved key that nested `data` sets."""
    return [(key, moves[key]) for key in _flat(data) if key in moves]


def moved_in_overrides(
    items: Iterable[str], moves: dict[str, str] = MOVED_KEYS
) -> list[tuple[str, str]]:
    """(old, new) for every moved key among `key=value` items."""
    keys = [item.partition("=")[0] for item in items]
    return [(key, moves[key]) for key in keys if key in moves]


def move_keys(data: dict, moves: dict[str, str] = MOVED_KEYS) -> dict:
    """A copy of nested `data` with every moved key under its new name (the new one wins)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in moves.items():
        group, _, key = old.partition(".")
        if not isinstance(out.get(group), dict) or key not in out[group]:
            continue
        value = out[group].pop(key)
        new_group, _, new_key = new.partition(".")
        out.setdefault(new_group, {}).setdefault(new_key, value)
    return out
