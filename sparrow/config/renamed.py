"""Config keys that were renamed: the old name is still read, with a warning naming the new one.

    data = rename_keys(data, CONFIG_RENAMES, source="sparrow/conf/calibrate/my.yaml")   # nested dict
    dotlist = rename_overrides(["calibrate.budgets=[4,8]"], CONFIG_RENAMES)    # key=value items

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
