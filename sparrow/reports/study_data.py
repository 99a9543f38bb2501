"""A study's rows from the workdir's DuckDB file, read-only: what the study report shows.

    data = load_study_data("./sparrow-work", "s1")
    data.arms[0].name, data.arms[0].series("reward/mean"), data.arms[0].bins
    data.study.reference_arm

Reads study_arms (the arms, their order and the study definition), runs, step_metrics,
bin_stats (every column: a file written before min and share_below_half existed gives None
for them) and the schedules the arms decoded with. Nothing else: a report can be made after
the fact, on another machine, while a run is still writing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparrow.config.study import StudyConfig, arm_workdir, study_from_yaml
from sparrow.errors import SparrowError
from sparrow.reports.run import config_value
from sparrow.sparse import Schedule
from sparrow.sparse.io import schedule_from_dict
from sparrow.storage.schedule_rows import SCHEDULE_COLUMNS, schedule_row
from sparrow.storage.study_rows import run_tables, study_arm_rows, study_ids

# metrics renamed since a run could have written them (docs/glossary.md): old -> new
RENAMED_METRICS = {"schedule/budget_pages_mean": "schedule/pages_read_mean"}


class StudyReportError(SparrowError):
    """A study report that cannot be made; the message names what is missing."""


@dataclass(frozen=True)
class ArmData:
    """One arm: its run's row, config, step metrics and bin_stats rows."""

    name: str
    run_id: str
    overrides: list[str]
    run: dict[str, Any]
    config: dict[str, Any]
    metrics: dict[str, dict[int, float]]
    bins: list[dict[str, Any]]

    def series(self, name: str) -> tuple[list[int], list[float]]:
        points = sorted((s, v) for s, v in self.metrics.get(name, {}).items() if v is not None)
        return [s for s, _ in points], [v for _, v in points]

    def setting(self, dotted: str, default: Any = None) -> Any:
        value = config_value(self.config, dotted)
        return default if value is None else value

    @property
    def steps(self) -> list[int]:
        trained = set(self.series("reward/mean")[0]) | {int(b["step"]) for b in self.bins}
        return sorted(s for s in trained if s > 0)


@dataclass(frozen=True)
class StudyData:
    study_id: str
    workdir: str
    study: StudyConfig
    arms: list[ArmData]
    # (name, version) -> the schedule, for every version an arm decoded with
    schedules: dict[tuple[str, int], Schedule] = field(default_factory=dict)

    def arm(self, name: str) -> ArmData | None:
        return next((a for a in self.arms if a.name == name), None)


def _config(text: str | None) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) if text else {}
    except yaml.YAMLError:
        data = {}
    return data if isinstance(data, dict) else {}


def load_study_data(workdir: str | Path, study_id: str) -> StudyData:
    present = study_ids(workdir)
    if study_id not in present:
        listed = ", ".join(present) if present else "none yet"
        raise StudyReportError(
            f"no study {study_id!r} in {Path(workdir) / 'sparrow.duckdb'}; studies: {listed}"
        )
    arms_rows = study_arm_rows(workdir, study_id)
    tables = _arm_tables(workdir, arms_rows)
    runs = {r["run_id"]: r for r in tables["runs"]}
    metrics: dict[str, dict[str, dict[int, float]]] = {}
    for r in tables["step_metrics"]:
        name = RENAMED_METRICS.get(r["name"], r["name"])
        metrics.setdefault(r["run_id"], {}).setdefault(name, {})[r["step"]] = r["value"]
    bins: dict[str, list[dict]] = {}
    for r in tables["bin_stats"]:
        bins.setdefault(r["run_id"], []).append(r)
    arms = [
        ArmData(
            r["arm"],
            r["run_id"],
            list(r["overrides"] or []),
            runs.get(r["run_id"], {"run_id": r["run_id"]}),
            _config(runs.get(r["run_id"], {}).get("config_yaml")),
            metrics.get(r["run_id"], {}),
            bins.get(r["run_id"], []),
        )
        for r in arms_rows
    ]
    return StudyData(
        study_id,
        str(workdir),
        study_from_yaml(arms_rows[0]["study_yaml"]),
        arms,
        _schedules(tables["schedules"]),
    )


def _arm_tables(workdir: str | Path, arms_rows: list[dict]) -> dict[str, list[dict]]:
    """The arms' runs tables, each read from the workdir its run wrote (study.own_workdirs: its
    own; otherwise the study's)."""
    by_workdir: dict[Path, list[str]] = {}
    for row in arms_rows:
        where = arm_workdir(list(row["overrides"] or []), workdir)
        by_workdir.setdefault(where, []).append(row["run_id"])
    tables: dict[str, list[dict]] = {
        "runs": [],
        "step_metrics": [],
        "bin_stats": [],
        "schedules": [],
    }
    for where, run_ids in by_workdir.items():
        for name, rows in run_tables(where, run_ids).items():
            tables[name].extend(rows)
    return tables


def _schedules(rows: list[dict]) -> dict[tuple[str, int], Schedule]:
    out = {}
    for row in rows:
        data = schedule_row([row.get(k) for k in SCHEDULE_COLUMNS])
        out[(row["name"], int(row["version"]))] = schedule_from_dict(data, "schedules row")
    return out
