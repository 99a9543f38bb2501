"""One seed's learning curves from its folder (scripts/study_seed.sh's, or the merge of its
holds by scripts/study_merge_holds.py): per arm and step, the dense policy's held-out accuracy,
the sparse actor's mean reward, the KV pages it read per token and the worst bin's p5.

    python scripts/study_curves.py results/v2-s0 --out docs/img/study_v2_s0.png

Writes the figure and, beside it, the same numbers as CSV (`<out>.csv`: arm, step and the four
columns; empty where a step has none, e.g. the eval every pipeline.eval_every steps).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from matplotlib.figure import Figure

COLUMNS = {
    "eval/accuracy": "dense policy: held-out accuracy",
    "reward/mean": "sparse actor: mean reward",
    "schedule/pages_read_mean": "KV pages read per token",
    "mismatch/min_p5": "worst bin's p5 (measured)",
}


def read_curves(folder: Path) -> dict[str, list[dict[str, str]]]:
    """Each arm's steps (step >= 1) from `<arm>_steps.csv`, the columns of COLUMNS only."""
    arms = {}
    for path in sorted(folder.glob("*_steps.csv")):
        with open(path, newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if int(r["step"]) >= 1]
        arms[path.name.removesuffix("_steps.csv")] = [
            {"step": r["step"], **{c: r.get(c, "") for c in COLUMNS}} for r in rows
        ]
    if not arms:
        raise SystemExit(f"{folder}: no <arm>_steps.csv (not a seed's folder)")
    return arms


def write_csv(arms: dict[str, list[dict[str, str]]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arm", "step", *COLUMNS])
        for arm, rows in arms.items():
            for row in rows:
                writer.writerow([arm, row["step"], *(row[c] for c in COLUMNS)])


def plot(arms: dict[str, list[dict[str, str]]], title: str, path: Path) -> None:
    fig = Figure(figsize=(14, 9), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, (column, ylabel) in zip(axes, COLUMNS.items()):
        for i, (arm, rows) in enumerate(arms.items()):
            points = [(int(r["step"]), float(r[column])) for r in rows if r[column] != ""]
            if points:
                steps, values = zip(*points)
                style = "--" if i >= 10 else "-"
                marker = "o" if column == "eval/accuracy" else None
                ax.plot(steps, values, style, marker=marker, markersize=3, label=arm, color=f"C{i}")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a seed's folder")
    p.add_argument("--out", type=Path, required=True, help="the figure (PNG); its CSV beside it")
    args = p.parse_args()
    arms = read_curves(args.folder)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(arms, args.out.with_suffix(".csv"))
    plot(arms, f"{args.folder.name}: {len(arms)} arms", args.out)
    print(f"{args.out} and {args.out.with_suffix('.csv')}: {len(arms)} arms")


if __name__ == "__main__":
    main()
