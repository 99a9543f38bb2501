"""What each arm of each seed did over its first steps: the sparse actor's mean reward, the KV
pages it read per token and the worst bin's p5, each the mean over steps FIRST..LAST, one CSV
row per seed and arm (descriptive; not part of the pre-registered analysis).

    python scripts/study_early_steps.py v2-s0 v2-s1 v2-s2 --steps 1-5 --out early.csv

Reads each seed folder's `<arm>_steps.csv` as scripts/study_analysis.py does (its read_csv and
seed_of); a folder not named <variant>-s<seed>, or a range with no step in it, is one error.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from study_analysis import read_csv, seed_of

COLUMNS = {
    "reward": "reward/mean",
    "pages_read": "schedule/pages_read_mean",
    "worst_bin_p5": "mismatch/min_p5",
}


def early_rows(folder: Path, first: int, last: int) -> list[dict]:
    """One row per arm of a seed folder: the means of COLUMNS over steps first..last."""
    variant, seed = seed_of(folder)
    rows = []
    for steps_csv in sorted(folder.glob("*_steps.csv")):
        arm = steps_csv.name.removesuffix("_steps.csv")
        kept = [r for r in read_csv(steps_csv) if first <= r["step"] <= last]
        if not kept:
            raise SystemExit(f"{steps_csv}: no step in {first}-{last}")
        row = {"variant": variant, "seed": seed, "arm": arm, "steps": len(kept)}
        for name, column in COLUMNS.items():
            values = [r[column] for r in kept if r.get(column) is not None]
            row[name] = round(sum(values) / len(values), 4) if values else None
        rows.append(row)
    if not rows:
        raise SystemExit(f"{folder}: no <arm>_steps.csv")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--steps", default="1-5", help="FIRST-LAST, inclusive (default 1-5)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    bounds = re.fullmatch(r"(\d+)-(\d+)", args.steps)
    if not bounds or int(bounds[1]) > int(bounds[2]):
        p.error(f"--steps must be FIRST-LAST with FIRST <= LAST, got {args.steps!r}")
    rows = [r for f in args.folders for r in early_rows(f, int(bounds[1]), int(bounds[2]))]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.out}: {len(rows)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
