"""Schedule files and lookup: to and from dicts, YAML/JSON files, and name-or-path resolution.

    from sparrow.sparse.io import resolve_schedule, save_schedule_yaml
    s = resolve_schedule("qwen3-1.7b-0.86")          # a preset
    save_schedule_yaml(s, "my.yaml")                 # write-then-rename
    resolve_schedule("my.yaml")                      # a file (.yaml, .yml or .json)
    resolve_schedule("calibrated-3", extra=stored)   # a name the caller passes in

A schedule file is a mapping with the keys of `schedule_to_dict`; `name` and `topk_pages` are
required, the rest default to the reference values (page 16, bins of 2,000 tokens,
reserved_bos 1, reserved_eos 2, skip_layers [0, 1], target 0.86, selection centroid, no
dense_heads). docs/schedules.md has an example.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sparrow.sparse.presets import PRESETS
from sparrow.sparse.schedule import Schedule, ScheduleError

KEYS = (
    "name",
    "page_size",
    "bin_tokens",
    "topk_pages",
    "reserved_bos",
    "reserved_eos",
    "skip_layers",
    "target",
    "description",
    "selection",
    "dense_heads",
)
REQUIRED_KEYS = ("name", "topk_pages")
FILE_SUFFIXES = (".yaml", ".yml", ".json")


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    """Plain-data form of a schedule (lists, not tuples), in the order of KEYS."""
    return {
        "name": schedule.name,
        "page_size": schedule.page_size,
        "bin_tokens": schedule.bin_tokens,
        "topk_pages": list(schedule.topk_pages),
        "reserved_bos": schedule.reserved_bos,
        "reserved_eos": schedule.reserved_eos,
        "skip_layers": list(schedule.skip_layers),
        "target": schedule.target,
        "description": schedule.description,
        "selection": schedule.selection,
        "dense_heads": [list(pair) for pair in schedule.dense_heads],
    }


def schedule_from_dict(data: Mapping[str, Any], source: str = "schedule") -> Schedule:
    """Build a Schedule from a mapping; `source` (a path, a table row) names it in errors."""
    if not isinstance(data, Mapping):
        raise ScheduleError(f"{source}: a schedule must be a mapping, got {type(data).__name__}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ScheduleError(
            f"{source}: unknown schedule key {unknown[0]!r}; valid keys: {', '.join(KEYS)}"
        )
    # a stored row from before a column existed holds NULL there: the default
    data = {k: v for k, v in data.items() if v is not None or k in REQUIRED_KEYS}
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ScheduleError(f"{source}: missing required schedule key {missing[0]!r}")
    for key in ("topk_pages", "skip_layers", "dense_heads"):
        if key in data and not isinstance(data[key], (list, tuple)):
            raise ScheduleError(f"{source}: {key} must be a list, got {data[key]!r}")
    if "description" in data and not isinstance(data["description"], str):
        raise ScheduleError(f"{source}: description must be a string, got {data['description']!r}")
    try:
        return Schedule(**dict(data))
    except ScheduleError as err:
        raise ScheduleError(f"{source}: {err}") from None


def save_schedule_yaml(schedule: Schedule, path: str | os.PathLike) -> Path:
    """Write the schedule as YAML next to `path`, then rename it into place (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(schedule_to_dict(schedule), sort_keys=False, default_flow_style=None)
    # a plain open (not mkstemp) so the file gets the usual permissions
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_schedule_yaml(path: str | os.PathLike) -> Schedule:
    """Read a schedule file: YAML (.yaml, .yml) or JSON (.json)."""
    path = Path(path)
    if not path.is_file():
        raise ScheduleError(f"schedule file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScheduleError(f"{path}: not a schedule file (not UTF-8 text)") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        reason = str(err).splitlines()[0]
        raise ScheduleError(f"{path}: not a valid schedule file ({reason})") from None
    return schedule_from_dict(data, source=str(path))


def resolve_schedule(spec: str, extra: Mapping[str, Schedule] | None = None) -> Schedule:
    """A schedule from a file path, a name in `extra`, or a preset name.

    A spec ending in .yaml, .yml or .json is a file. Otherwise a name in `extra` (the pipeline
    passes calibrated schedules from storage; one there shadows a preset of the same name),
    then a preset, then an existing file of that name.
    """
    extra = extra or {}
    if spec.endswith(FILE_SUFFIXES):
        return load_schedule_yaml(spec)
    if spec in extra:
        return extra[spec]
    if spec in PRESETS:
        return PRESETS[spec]
    if os.path.isfile(spec):
        return load_schedule_yaml(spec)
    known = list(PRESETS) + [name for name in extra if name not in PRESETS]
    raise ScheduleError(
        f"unknown schedule {spec!r}: not a preset, a known schedule or a .yaml/.yml/.json "
        f"file; known names: {', '.join(known)}. A calibrated schedule is known in the "
        f"workdir it was calibrated into: `sparrow calibrate ... calibrate.name={spec}` there "
        f"first, or check pipeline.workdir"
    )
