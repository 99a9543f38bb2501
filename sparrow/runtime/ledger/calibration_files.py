"""The calibrate flow's files, under `<workdir>/calibrations/<calibration_id>/`, and their readers.

    folder = calibration_dir(workdir, calibration_id)
    trajectories, data = read_trajectories(folder / TRAJECTORIES)   # sample_task's
    table = table_from_dict(json.loads((folder / CALIBRATION_TABLE).read_text()))  # replay_task's

Each task of sparrow/stages/calibrate.py and calibrate_store.py reads the previous one's file
through these, so it can be re-run alone; the train flow's stage files are contract.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparrow.storage import atomic_file

if TYPE_CHECKING:
    from sparrow.control.calibration import AcceptanceTable, Trajectory

TRAJECTORIES = "trajectories.json"
CALIBRATION_TABLE = "table.json"
CALIBRATION_SUMMARY = "summary.json"
CALIBRATION_PLOT = "calibration.png"
CALIBRATION_FILES = (TRAJECTORIES, CALIBRATION_TABLE, CALIBRATION_SUMMARY, CALIBRATION_PLOT)


def calibration_dir(workdir: str | Path, calibration_id: str) -> Path:
    return Path(workdir) / "calibrations" / calibration_id


def write_json(path: Path, data: Any) -> Path:
    with atomic_file(path) as scratch:
        scratch.write_text(json.dumps(data, indent=1))
    return path


def trajectory_dict(trajectory: Trajectory) -> dict:
    return {"ids": list(trajectory.ids), "prompt_len": trajectory.prompt_len}


def as_trajectories(rows: list[dict]) -> list[Trajectory]:
    from sparrow.control.calibration import Trajectory

    return [Trajectory(tuple(t["ids"]), t["prompt_len"]) for t in rows]


def read_trajectories(path: str | Path) -> tuple[list[Trajectory], dict]:
    """trajectories.json: (the dense trajectories, the whole file)."""
    data = json.loads(Path(path).read_text())
    return as_trajectories(data["trajectories"]), data


def table_to_dict(table: AcceptanceTable) -> dict:
    import numpy as np

    from sparrow.control.acceptance_table import STATISTICS

    def listed(array: np.ndarray) -> list:
        return [[None if np.isnan(v) else float(v) for v in row] for row in array]

    return {
        "topk_pages": list(table.topk_pages),
        "bin_tokens": table.bin_tokens,
        "tokens": [int(n) for n in table.tokens],
        **{
            name: listed(getattr(table, name))
            for name in STATISTICS
            if getattr(table, name) is not None
        },
        **{name: listed(bound) for name, bound in table.bounds.items()},
        **({} if table.samples is None else {"samples": [int(n) for n in table.samples]}),
    }


def table_from_dict(data: dict) -> AcceptanceTable:
    """table.json's contents as an AcceptanceTable (a file written before the rename calls
    the grid "budgets"; one written before min and share_below_half, or the bounds and the
    trajectory counts, existed has none of them)."""
    import numpy as np

    from sparrow.control.acceptance_table import BOUNDS, STATISTICS, AcceptanceTable

    def array(key: str) -> np.ndarray:
        return np.array(
            [[np.nan if v is None else v for v in row] for row in data[key]], dtype=np.float64
        )

    return AcceptanceTable(
        tuple(data["topk_pages"] if "topk_pages" in data else data["budgets"]),
        data["bin_tokens"],
        np.array(data["tokens"], dtype=np.int64),
        **{name: array(name) for name in STATISTICS if name in data},
        samples=np.array(data["samples"], dtype=np.int64) if "samples" in data else None,
        bounds={name: array(name) for name in BOUNDS if name in data},
    )
