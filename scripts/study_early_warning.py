"""Which step statistic rose before the sparse actor's reward collapsed (docs/study.md,
twentieth addendum; sparrow/experiments/early_warning.py holds the definitions).

    python scripts/study_early_warning.py v3-s0 --out DIR                 # every signal's AUC
    python scripts/study_early_warning.py v3-s1 v3-s2 --out DIR \\
        --fixed approx_kl=3e-05                                          # a threshold fixed before

FOLDERs are seed folders or hold folders (scripts/study_seed.sh's; read through
scripts/study_analysis.py's read_csv and seed_of); each `<arm>_steps.csv` but dense's is one
unit. Writes DIR/early_warning.json and DIR/early_warning.md: per unit its collapses, per
signal the pooled step-level AUC with a 95% unit-bootstrap interval, each signal's Youden
threshold on these units, and for --fixed the collapses warned of and the false alarms.
--figure PATH.png draws, per unit, the sparse reward and the update's KL by step with its
collapses marked (the numbers as PATH.csv beside it).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from study_analysis import fmt, markdown_table, read_csv, seed_of

from sparrow.experiments import early_warning as ew
from sparrow.experiments.study_analysis import DENSE


def load(folders: list[Path]) -> list[dict]:
    """One unit per sparse arm's steps CSV; an arm met twice (two holds of a seed both ran
    it) or a folder without one is an error that names it."""
    units: dict[str, dict] = {}
    for folder in folders:
        variant, seed = seed_of(folder)
        found = sorted(folder.glob("*_steps.csv"))
        if not found:
            raise SystemExit(f"{folder}: no <arm>_steps.csv")
        for path in found:
            arm = path.name.removesuffix("_steps.csv")
            if arm == DENSE:
                continue
            name = f"{variant}-s{seed}/{arm}"
            if name in units:
                raise SystemExit(f"{path}: {name} is already read from another folder")
            units[name] = {"name": name, "rows": read_csv(path)}
    return list(units.values())


def markdown(result: dict) -> str:
    lines = ["# Early warning of a collapse (docs/study.md, twentieth addendum)", ""]
    lines += [
        f"Collapse: reward below {ew.DROP} x its mean over the {ew.WINDOW} steps before, from"
        f" at least {ew.HEALTHY}; a step is positive when one follows within {ew.HORIZON} steps.",
        "",
    ]
    lines += markdown_table(
        ["unit", "collapses at"],
        ([u["unit"], ", ".join(map(str, u["collapses"])) or "-"] for u in result["units"]),
    )
    lines.append("")
    lines += markdown_table(
        [
            "signal",
            "steps (before a collapse)",
            "AUC [95% CI, units]",
            "AUC - reward's [paired CI]",
            "Youden threshold",
        ],
        (
            [
                row["signal"],
                f"{row['steps']} ({row['before_collapse']})",
                f"{fmt(row['auc'])} {fmt(row['auc_ci'])}",
                f"{fmt(row['minus_reward'])} {fmt(row['minus_reward_ci'])}",
                "-" if row["youden"] is None else f"{row['youden']:.4g}",
            ]
            for row in result["signals"]
        ),
    )
    for fixed in result["fixed"]:
        lines += [
            "",
            f"Fixed threshold {fixed['signal']} >= {fixed['threshold']:g}: "
            f"{fixed['warned']} of {fixed['collapses']} collapses warned of; "
            f"{fixed['false_alarms']} of {fixed['quiet_steps']} steps without one ahead alarmed "
            f"({fmt(fixed['false_alarm_share'])}).",
        ]
    return "\n".join(lines) + "\n"


FIGURE_SIGNAL = "approx_kl"  # the primary signal of question (g)


def figure(units: list[dict], path: Path) -> None:
    """Per unit: the sparse reward (left axis) and FIGURE_SIGNAL (right, log) by step, the
    collapses as dashed lines; PATH.csv holds the plotted numbers."""
    from matplotlib.figure import Figure

    column = ew.SIGNALS[FIGURE_SIGNAL][0]
    table = []
    for unit in units:
        starts = set(ew.onsets(ew.rewards(unit["rows"])))
        for row in unit["rows"]:
            if row.get(ew.REWARD) is not None and row["step"] >= 1:
                table.append([unit["name"], int(row["step"]), row[ew.REWARD], row.get(column),
                              int(row["step"] in starts)])  # fmt: skip
    with open(path.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["unit", "step", ew.REWARD, column, "collapse"])
        writer.writerows(table)
    columns = 4
    rows = -(-len(units) // columns)
    fig = Figure(figsize=(4.2 * columns, 2.6 * rows), layout="constrained")
    for index, unit in enumerate(units):
        ax = fig.add_subplot(rows, columns, index + 1)
        mine = [r for r in table if r[0] == unit["name"]]
        ax.plot([r[1] for r in mine], [r[2] for r in mine], color="tab:blue", lw=1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(unit["name"], fontsize=9)
        kl = ax.twinx()
        kept = [r for r in mine if r[3] is not None and r[3] > 0]
        kl.plot([r[1] for r in kept], [r[3] for r in kept], color="tab:red", lw=0.8)
        kl.set_yscale("log")
        for r in mine:
            if r[4]:
                ax.axvline(r[1], color="black", ls="--", lw=0.8)
        if index % columns == 0:
            ax.set_ylabel("sparse reward", color="tab:blue")
        if index % columns == columns - 1 or index == len(units) - 1:
            kl.set_ylabel(FIGURE_SIGNAL, color="tab:red")
    fig.suptitle(f"reward, {FIGURE_SIGNAL} and collapses (dashed)")
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="seed or hold folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and table")
    parser.add_argument(
        "--fixed", action="append", default=[], help="SIGNAL=THRESHOLD fixed beforehand"
    )
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--figure", type=Path, help="a PNG of reward and approx_kl per unit")
    args = parser.parse_args()
    fixed = []
    for text in args.fixed:
        signal, _, value = text.partition("=")
        if signal not in ew.SIGNALS:
            parser.error(f"--fixed {text}: no signal {signal!r} (one of {', '.join(ew.SIGNALS)})")
        try:
            fixed.append((signal, float(value)))
        except ValueError:
            parser.error(f"--fixed {text}: the threshold must be a number")
    units = load(args.folders)
    signals = ew.report(units, args.resamples)
    for row in signals:
        row["youden"] = ew.youden(units, row["signal"])
    result = {
        "folders": [str(f) for f in args.folders],
        "definitions": {
            "window": ew.WINDOW,
            "healthy": ew.HEALTHY,
            "drop": ew.DROP,
            "after": ew.AFTER,
            "horizon": ew.HORIZON,
            "trail": ew.TRAIL,
            "resamples": args.resamples,
        },
        "units": [
            {"unit": u["name"], "collapses": ew.onsets(ew.rewards(u["rows"]))} for u in units
        ],
        "signals": signals,
        "fixed": [{"signal": s, "threshold": t, **ew.alarm_rates(units, s, t)} for s, t in fixed],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "early_warning.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "early_warning.md").write_text(markdown(result))
    if args.figure:
        figure(units, args.figure)
    print(
        f"{args.out}/early_warning.md: {len(units)} units, "
        f"{sum(len(u['collapses']) for u in result['units'])} collapses"
    )


if __name__ == "__main__":
    main()
