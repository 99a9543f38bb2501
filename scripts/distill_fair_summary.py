"""The fair test's summary (docs/distill.md, "A fair test"; the verdict is
sparrow/experiments/distill_fair.py's) over the seeds' JSON from benchmarks/distill.py.

    python scripts/distill_fair_summary.py out/seed-0.json out/seed-1.json out/seed-2.json \
        --out out/summary.json [--plot docs/img/distill_fair.png]

A file's seed is its `args.seed`. Prints one line per seed and the verdicts; writes them as JSON.
With --plot, a figure of two panels: per step, the p5 of each step's own rollouts with and
without the LoRA (the same tokens), and per seed the fixed set's p5 without and with it (the
held-out pairing); beside it `<plot>.csv`, the per-step numbers (seed, step, tokens, p5 and worst
bin's p5 with and without the LoRA, reward when the report has it).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from sparrow.experiments.distill_fair import seed_row, verdict

STEP_COLUMNS = ("tokens", "p5_lora", "p5_base", "min_bin_p5_lora", "min_bin_p5_base", "reward_mean")


def write_plot(reports: list[dict], rows: list[dict], path: Path) -> Path:
    """The figure of the module's docstring at `path` and its per-step CSV beside it."""
    from matplotlib.figure import Figure

    for report in reports:  # what the figure draws, checked before anything is written
        for step in report["steps"]:
            for key in ("step", "p5_lora", "p5_base"):
                if key not in step:
                    raise KeyError(key)
    table = path.with_suffix(path.suffix + ".csv")
    with open(table, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(("seed", "step", *STEP_COLUMNS))
        for report in reports:
            for step in report["steps"]:
                out.writerow(
                    (report["args"]["seed"], step["step"], *(step.get(c, "") for c in STEP_COLUMNS))
                )
    figure = Figure(figsize=(11, 4), layout="constrained")
    own, held = figure.subplots(1, 2, width_ratios=(2, 1))
    for i, report in enumerate(reports):
        steps = [s["step"] for s in report["steps"]]
        color = f"C{i}"
        seed = report["args"]["seed"]
        own.plot(
            steps, [s["p5_lora"] for s in report["steps"]], color=color, label=f"seed {seed}, with"
        )
        own.plot(
            steps, [s["p5_base"] for s in report["steps"]], color=color, ls="--", label="without"
        )
    own.set(xlabel="distill step", ylabel="p5 of the step's own rollouts")
    own.set_title("own rollouts (sampled with the LoRA)", fontsize=10)
    own.legend(fontsize=7, ncols=len(reports))
    for i, row in enumerate(rows):
        held.plot(
            [0, 1],
            [row["p5_base"], row["p5_lora"]],
            "o-",
            color=f"C{i}",
            label=f"seed {row['seed']}",
        )
        held.errorbar(
            1,
            row["p5_lora"],
            yerr=[[row["delta"] - row["low"]], [row["high"] - row["delta"]]],
            color=f"C{i}",
            capsize=3,
        )
    held.set_xticks([0, 1], ["without", "with the LoRA"])
    held.set(xlim=(-0.4, 1.4), ylabel="fixed set's p5")
    held.set_title("held-out fixed set (95% CI of the difference)", fontsize=10)
    held.legend(fontsize=7)
    figure.savefig(path, dpi=110)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path, help="a PNG of the steps and the fixed set (+ .csv)")
    args = parser.parse_args(argv)
    rows, reports = [], []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
            rows.append(seed_row(int(report["args"]["seed"]), report))
            reports.append(report)
        except (OSError, ValueError, KeyError) as err:
            print(f"{path}: not a benchmarks/distill.py report with a fixed set ({err!r})")
            return 2
    rows.sort(key=lambda r: r["seed"])
    reports.sort(key=lambda r: int(r["args"]["seed"]))
    summary = {"seeds": rows, "verdict": verdict(rows)}
    for r in rows:
        print(
            f"seed {r['seed']}: p5 with - without the LoRA {r['delta']:+.4f} "
            f"[{r['low']:+.4f}, {r['high']:+.4f}], with the LoRA {r['p5_lora']:.4f}"
        )
    print(json.dumps(summary["verdict"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot:
        try:
            print(f"wrote {args.plot} and {write_plot(reports, rows, args.plot)}")
        except KeyError as err:
            print(f"--plot: a report's steps lack {err} (benchmarks/distill.py's step rows)")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
