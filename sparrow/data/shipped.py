"""Datasets shipped with the package, named "builtin:NAME" like the synthetic tasks.

    shipped_path("builtin:math-train")   # .../sparrow/assets/datasets/math-train.parquet
    shipped_path("builtin:synthetic")    # None: a synthetic task, not a file

"builtin:NAME" reads sparrow/assets/datasets/NAME.parquet when that file exists (files in the
community layout; sparrow/data/math_examples.py writes the math set), so a config preset can
name them wherever the package is installed.
"""

from __future__ import annotations

from pathlib import Path

DATASETS_DIR = Path(__file__).resolve().parents[1] / "assets" / "datasets"
PREFIX = "builtin:"


def shipped_names() -> list[str]:
    return sorted(PREFIX + path.stem for path in DATASETS_DIR.glob("*.parquet"))


def shipped_path(spec: str) -> Path | None:
    """The shipped file "builtin:NAME" names, or None when it names none."""
    if not spec.startswith(PREFIX):
        return None
    path = DATASETS_DIR / f"{spec[len(PREFIX) :]}.parquet"
    return path if "/" not in spec and path.is_file() else None
