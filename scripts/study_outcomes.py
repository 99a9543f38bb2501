"""Every seed's held-out outcome per arm in one figure, each marked with its pre-registered
label: what moves between seeds and what does not.

    python scripts/study_outcomes.py results/v2-s0 results/v2-s1 --out docs/img/study_v2_outcomes.png

Reads the seed folders as scripts/study_analysis.py does (its load_units: summary.json and
the per-step CSVs) and labels each unit by sparrow/experiments/study_analysis.py's rule.
Writes the figure and beside it `<out>.csv` (variant, seed, arm, outcome, gap, label). Arms
run left to right from dense by their mean outcome over the seeds; the starting model's
outcome is the dashed line.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from study_analysis import load_units

from sparrow.experiments.study_analysis import DENSE, Unit, label

MARKERS = {"stable": "o", "stalled": "s", "destabilized": "X", None: "."}


def rows_of(units: list[Unit]) -> list[dict]:
    return [
        {"variant": u.variant, "seed": u.seed, "arm": u.arm, "outcome": u.outcome,
         "gap": u.gap, "label": label(u)}
        for u in sorted(units, key=lambda u: (u.variant, u.seed, u.arm))
    ]  # fmt: skip


def arm_order(rows: list[dict]) -> list[str]:
    """dense first, then the arms by their mean outcome over the seeds, highest first."""
    means = {}
    for arm in {r["arm"] for r in rows}:
        found = [r["outcome"] for r in rows if r["arm"] == arm and r["outcome"] is not None]
        means[arm] = float(np.mean(found)) if found else -1.0
    return sorted(means, key=lambda a: (a != DENSE, -means[a], a))


def plot(rows: list[dict], starts: list[float], title: str, path: Path) -> None:
    arms = arm_order(rows)
    seeds = sorted({r["seed"] for r in rows})
    fig = Figure(figsize=(12, 5), layout="constrained")
    ax = fig.subplots()
    for k, seed in enumerate(seeds):
        offset = (k - (len(seeds) - 1) / 2) * 0.12
        for row in (r for r in rows if r["seed"] == seed and r["outcome"] is not None):
            ax.scatter(arms.index(row["arm"]) + offset, row["outcome"], s=60,
                       marker=MARKERS[row["label"]], color=f"C{k}")  # fmt: skip
        ax.scatter([], [], marker="o", color=f"C{k}", label=f"seed {seed}")
    for name, marker in MARKERS.items():
        if name is not None:
            ax.scatter([], [], marker=marker, color="0.4", label=name)
    if starts:
        ax.axhline(float(np.mean(starts)), ls="--", color="0.5", label="start")
    ax.set_xticks(range(len(arms)), arms, rotation=20)
    ax.set_ylabel("dense policy's held-out accuracy (outcome)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(title)
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", type=Path, nargs="+", help="seed folders, <variant>-s<seed>")
    p.add_argument("--out", type=Path, required=True, help="the figure (PNG); its CSV beside it")
    args = p.parse_args()
    units, _ = load_units(args.folders)
    rows = rows_of(units)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    starts = sorted({u.start for u in units if u.start is not None})
    variants = ", ".join(sorted({u.variant for u in units}))
    seeds = ", ".join(str(seed) for seed in sorted({u.seed for u in units}))
    plot(
        rows,
        starts,
        f"{variants}: outcome per arm, seeds {seeds}",
        args.out,
    )
    print(f"{args.out} and {args.out.with_suffix('.csv')}: {len(rows)} units")


if __name__ == "__main__":
    main()
