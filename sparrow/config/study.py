"""The stability study's definition: its arms (name + train overrides) and the collapse rule.

    from sparrow.config.study import load_study, study_yaml
    study = load_study("default", ["fixed_topk_pages=29"])   # sparrow/conf/study/default.yaml
    study = load_study("my_study.yaml")                         # or a file of the same form
    [(arm.name, arm.overrides) for arm in study.arms]

A study (sparrow/flows/study.py, docs/study-tool.md) runs one train run per arm, `<study_id>-<arm>`,
from the same model, data and seeds; each arm differs only by its overrides (and, with
`fixed_budget: true`, by a flat schedule of `fixed_topk_pages` pages in every bin). The
YAML holds the fields below, each with a comment line above it; `key=value` overrides set
them (`sparrow study run ... study.KEY=VALUE`). The collapse rule is what the study report
labels an arm with: collapsed when the mean reward of its last `collapse_window` steps is below
`collapse_ratio` x the reference arm's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from sparrow.config.load import ConfigError, _merge, _read_yaml, conf_dir
from sparrow.config.renamed import STUDY_RENAMES, rename_keys, rename_overrides

# arm names and study ids become run ids and folder names
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class StudyArm:
    # the arm's name; its train run's id is <study_id>-<name>
    name: str = ""
    # train overrides of this arm (key=value or group=name), applied after the common ones
    overrides: list[str] = field(default_factory=list)
    # true: decode with a flat schedule of fixed_topk_pages top-k pages in every bin
    fixed_budget: bool = False


@dataclass(frozen=True)
class StudyConfig:
    # train overrides every arm gets first (model, data, steps); the command line's come after
    common: list[str] = field(default_factory=list)
    # the arms, run one after the other in this order (or at once with own_workdirs)
    arms: list[StudyArm] = field(default_factory=list)
    # top-k pages per bin of the arms marked fixed_budget, cheap enough to fall below target
    # (was `fixed_budget_pages`)
    fixed_topk_pages: int = 2
    # the arm the collapse rule compares with (dense rollout); "" for none (a hold of a seed
    # split over machines that leaves it out: its report's collapse labels are undecidable)
    reference_arm: str = "dense"
    # collapse rule: how many final steps of each arm's reward are averaged
    collapse_window: int = 5
    # collapse rule: collapsed when that mean < collapse_ratio x the reference arm's
    collapse_ratio: float = 0.8
    # true: each arm writes its own workdir, <workdir>/studies/<study_id>/arms/<arm>, so arms
    # can run at once in separate processes (sparrow study run ID --gpus 0,1,2,3)
    own_workdirs: bool = False


def check_arm_names(study: StudyConfig, names: Iterable[str]) -> None:
    """Refuse arm names the study does not have (`sparrow study run --arm`)."""
    known = [arm.name for arm in study.arms]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(
            f"no arm {', '.join(map(repr, unknown))} in the study; arms: {', '.join(known)}"
        )


def check_at_once(study: StudyConfig) -> None:
    """Arms that run at once need their own workdirs (a workdir has one writer)."""
    if not study.own_workdirs:
        raise ConfigError(
            "arms that run at once write their own workdirs: add "
            "study.own_workdirs=true (a study's arms share their settings "
            "from its first run on, so set it from the start)"
        )


def arm_workdir(overrides: list[str], default: str | Path) -> Path:
    """The workdir an arm's run writes: the last pipeline.workdir= of its overrides."""
    found = [o.split("=", 1)[1] for o in overrides if o.startswith("pipeline.workdir=")]
    return Path(found[-1]) if found else Path(default)


def study_path(spec: str, root: Path | None = None) -> Path:
    """sparrow/conf/study/<spec>.yaml, or spec itself when it names a .yaml/.yml file."""
    if spec.endswith((".yaml", ".yml")):
        return Path(spec)
    return (root or conf_dir()) / "study" / f"{spec}.yaml"


def load_study(
    spec: str = "default", overrides: Iterable[str] = (), root: Path | None = None
) -> StudyConfig:
    """The study named `spec` (or a YAML path) with `key=value` overrides, checked."""
    path = study_path(spec, root)
    if not path.is_file():
        options = sorted(p.stem for p in ((root or conf_dir()) / "study").glob("*.yaml"))
        raise ConfigError(
            f"study {spec!r}: no file {path}; studies: {', '.join(options)} (or a .yaml path)"
        )
    data = rename_keys(_read_yaml(path), STUDY_RENAMES, source=str(path))
    merged = _merge(OmegaConf.structured(StudyConfig), data, source=str(path))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"study override {item!r} is not of the form key=value")
    overrides = rename_overrides(overrides, STUDY_RENAMES)
    merged = _merge(merged, OmegaConf.from_dotlist(overrides), source="command line")
    study = OmegaConf.to_object(merged)
    assert isinstance(study, StudyConfig)
    check_study(study, str(path))
    return study


def check_study(study: StudyConfig, source: str = "study") -> None:
    names = [arm.name for arm in study.arms]
    if not names:
        raise ConfigError(f"{source}: a study needs at least one arm")
    bad = [n for n in names if not NAME_PATTERN.match(n)]
    if bad:
        raise ConfigError(f"{source}: arm name {bad[0]!r} must be letters, digits, '_', '.', '-'")
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: arm names must be unique, got {', '.join(names)}")
    if study.reference_arm and study.reference_arm not in names:
        raise ConfigError(
            f"{source}: reference_arm {study.reference_arm!r} is not an arm; "
            f'arms: {", ".join(names)} ("" for none)'
        )
    if study.fixed_topk_pages < 1 or study.collapse_window < 1:
        raise ConfigError(f"{source}: fixed_topk_pages and collapse_window must be >= 1")
    if not 0.0 < study.collapse_ratio <= 1.0:
        raise ConfigError(f"{source}: collapse_ratio must be in (0, 1], got {study.collapse_ratio}")


def check_study_id(study_id: str) -> str:
    if not NAME_PATTERN.match(study_id or ""):
        raise ConfigError(
            f"study id {study_id!r} must be letters, digits, '_', '.', '-' "
            f"(it starts every arm's run id)"
        )
    return study_id


def study_yaml(study: StudyConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(study))


def study_from_yaml(text: str) -> StudyConfig:
    """A study as study_yaml wrote it (the report reads it back from DuckDB)."""
    # a study stored before a key was renamed holds the old name: read it quietly
    data = rename_keys(
        OmegaConf.to_container(OmegaConf.create(text or "{}")),
        STUDY_RENAMES,
        source="study_arms.study_yaml",
        warn=False,
    )
    merged = _merge(OmegaConf.structured(StudyConfig), data, source="study_arms.study_yaml")
    return OmegaConf.to_object(merged)
