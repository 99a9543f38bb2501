"""The one-step-off check's analysis (docs/async.md; the numbers are
sparrow/experiments/async_check.py's), over the folders scripts/study_seed.sh brings back.

    python scripts/async_check_analysis.py v2_async-s0 v2_async-s1 v2_async-s2 \
        --study v2-s0 v2-s1 v2-s2 --out analysis-async

The one-step-off folders are `<name>-s<seed>` of sparrow/conf/study/study_v2_async.yaml
(async-0.86, async-dense and the synchronous centroid-0.86); each --study folder holds the
stability study's `dense` arm of its seed (a seed folder or hold 1's). Per seed and pair: the
two outcomes and their gap, the learning-phase gap (mean in-run eval of steps 10-50), the
one-step-off unit's label; per pair the mean gap, its 90% t-interval and the verdict; then
the check's verdict. Writes analysis.json and analysis.md into --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

from sparrow.experiments.async_check import PAIRS, equivalence, learning_phase, verdict
from sparrow.experiments.study_analysis import Unit, label


def read_arms(folder: Path) -> tuple[int, float | None, dict[str, dict]]:
    """(seed, start accuracy, {arm: outcome, steps, evals}) of one folder."""
    found = re.fullmatch(r"[a-z0-9_]+-s(\d+)", folder.name)
    if not found or not (folder / "summary.json").exists():
        raise SystemExit(f"{folder}: expected a study folder <name>-s<seed> with summary.json")
    summary = json.loads((folder / "summary.json").read_text())
    arms = {}
    for arm, entry in summary["arms"].items():
        evals = {}
        steps_csv = folder / f"{arm}_steps.csv"
        if steps_csv.exists():
            with open(steps_csv, newline="") as handle:
                for row in csv.DictReader(handle):
                    if row.get("eval/accuracy"):
                        evals[int(float(row["step"]))] = float(row["eval/accuracy"])
        arms[arm] = {
            "outcome": entry.get("outcome", {}).get("accuracy"),
            "steps": int(entry.get("steps_done") or 0),
            "evals": evals,
        }
    return int(found.group(1)), summary.get("start", {}).get("accuracy"), arms


def analyse(async_folders: list[Path], study_folders: list[Path]) -> dict:
    study = {}
    for folder in study_folders:
        seed, _, arms = read_arms(folder)
        study[seed] = arms
    rows, gaps, phase_gaps, destabilized = [], {}, {}, []
    for folder in async_folders:
        seed, start, arms = read_arms(folder)
        for arm, partner, _ in PAIRS:
            mine = arms.get(arm)
            theirs = (arms if partner in arms else study.get(seed, {})).get(partner)
            if mine is None or theirs is None:
                rows.append({"seed": seed, "arm": arm, "partner": partner, "missing": True})
                continue
            peak_step, peak = max(mine["evals"].items(), key=lambda e: e[1], default=(None, None))
            dense = study.get(seed, {}).get("dense", {}).get("outcome")  # for the label
            gap_to_dense = _minus(mine["outcome"], dense)
            unit = Unit(
                "v2",
                seed,
                arm,
                mine["outcome"],
                gap_to_dense,
                start,
                peak,
                peak_step,
                mine["steps"],
            )
            name = label(unit)
            if name == "destabilized":
                destabilized.append(f"{arm} seed {seed}")
            gap = _minus(mine["outcome"], theirs["outcome"])
            phase = _minus(learning_phase(mine["evals"]), learning_phase(theirs["evals"]))
            if name is not None:  # a unit under 50 steps is missing, not a gap
                gaps.setdefault(arm, []).append(gap)
                phase_gaps.setdefault(arm, []).append(phase)
            rows.append(
                {
                    "seed": seed,
                    "arm": arm,
                    "partner": partner,
                    "outcome": mine["outcome"],
                    "partner_outcome": theirs["outcome"],
                    "gap": gap,
                    "learning_phase_gap": phase,
                    "steps": mine["steps"],
                    "label": name,
                }
            )
    pairs = {arm: equivalence(gaps.get(arm, [])) for arm, _, _ in PAIRS}
    phases = {arm: equivalence(phase_gaps.get(arm, []), margin=0.10) for arm, _, _ in PAIRS}
    return {
        "rows": rows,
        "pairs": pairs,
        "learning_phase": phases,
        "destabilized": destabilized,
        "verdict": verdict(pairs, destabilized),
    }


def _minus(a, b):
    return None if a is None or b is None else a - b


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(result: dict) -> str:
    lines = ["# One-step-off check (pre-registered, docs/async.md)", ""]
    lines += ["| seed | arm | partner | outcome | partner | gap | steps 10-50 gap | label |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r.get("missing"):
            lines.append(f"| {r['seed']} | {r['arm']} | {r['partner']} | missing | | | | |")
            continue
        cells = [r["outcome"], r["partner_outcome"], r["gap"], r["learning_phase_gap"]]
        lines.append(
            f"| {r['seed']} | {r['arm']} | {r['partner']} | "
            + " | ".join(_fmt(c) for c in cells)
            + f" | {r['label']} |"
        )
    lines += ["", "| pair | seeds | mean gap | 90% interval | verdict (margin 0.05) |"]
    lines += ["|---|---|---|---|---|"]
    for (arm, partner, where), eq in zip(PAIRS, result["pairs"].values(), strict=True):
        lo_hi = eq["interval"] and "[" + ", ".join(f"{v:.3f}" for v in eq["interval"]) + "]"
        lines.append(
            f"| {arm} - {partner} ({where}) | {eq['seeds']} | {_fmt(eq['mean'])} | "
            f"{lo_hi or '-'} | {eq['verdict']} |"
        )
    lines += [
        "",
        f"Destabilized one-step-off units: {', '.join(result['destabilized']) or 'none'}.",
    ]
    lines += ["", f"**Verdict: {result['verdict']}.**", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="the one-step-off holds")
    parser.add_argument("--study", nargs="*", type=Path, default=[], help="dense's seed folders")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = analyse(args.folders, args.study)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "analysis.md").write_text(markdown(result))
    print(args.out / "analysis.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
