"""The pre-registered analysis (docs/study.md) over the seeds' folders that
scripts/study_seed.sh brings back: labels, question (a) per statistic with seed-bootstrap CIs,
(b) per sparse arm, (c), and the reasons a variant is inconclusive. Written before any seed ran.

    python scripts/study_analysis.py results/v2-s0 results/v2-s1 results/v2-s2 \
        results/v3-s0 results/v3-s1 results/v3-s2 --out analysis [--resamples 10000]

Each folder is `<variant>-s<seed>` with summary.json (outcomes), `<arm>_steps.csv`,
`<arm>_bins.csv`, `<arm>_samples.csv` (when kept; either may be `.csv.gz`) and
report/summary.json (predicted costs).
Writes analysis.json and analysis.md into --out. The numbers are
sparrow/experiments/study_analysis.py's.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from sparrow.data.multi_chase import ROLES
from sparrow.experiments.study import worst_per_step
from sparrow.experiments.study_analysis import (
    DENSE,
    RESAMPLES,
    Unit,
    auc_difference,
    inconclusive,
    label,
    mismatch_per_step_from_roles,
    non_inferior,
    predictor,
    rule_sufficient,
    transfer,
    worst_tail_per_step,
)
from sparrow.experiments.study_secondary import (
    divergence,
    divergence_question,
    raise_question,
    raised_early,
    tis_question,
)
from sparrow.sparse.target import get_statistic

BIN_STATISTICS = ("p1", "p5", "p10", "mean", "min", "share_below_half")
FIRST = 20  # "a predictor must warn early": the mean over steps 1-20
ROLE_COLUMNS = ("p5", "share_below_half")  # per role, reported beside the predictors
# the table's order: the roles that decide the reward first, then the harmless, then the rest
ROLE_ORDER = ("lookup", "answer", "benign", "local", "unknown")
assert set(ROLE_ORDER) == set(ROLES), "a role of multi_chase.ROLES is missing from ROLE_ORDER"
PARTLY_STORED = ("p0.1",)  # pre-registered; kept (`<arm>_tail.csv`) only from seed 2 of V2 on


def read_csv(path: Path) -> list[dict]:
    """Rows with numbers as floats, empty cells as None; none when the file is missing. A
    `name.csv` kept as `name.csv.gz` (scripts/study_outcome.py compresses the large tables) is
    read from there."""
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.exists():
        handle = gzip.open(packed, "rt", newline="")
    elif path.exists():
        handle = open(path, newline="")
    else:
        return []
    with handle:
        return [{k: _value(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _value(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return float(text)
    except ValueError:
        return text


def _means(per_step: dict[int, float]) -> dict[str, float]:
    """{'_first20': mean over steps 1-20, '_all': mean over every step}, where defined."""
    out = {}
    first = [v for s, v in per_step.items() if 1 <= s <= FIRST and v is not None]
    every = [v for s, v in per_step.items() if s >= 1 and v is not None]
    if first:
        out["_first20"] = float(np.mean(first))
    if every:
        out["_all"] = float(np.mean(every))
    return out


def unit_statistics(folder: Path, arm: str, roles: list[dict]) -> dict[str, float]:
    """The pre-registered statistics of one arm of one seed (roles: its `<arm>_roles.csv`)."""
    bins = read_csv(folder / f"{arm}_bins.csv")
    steps = read_csv(folder / f"{arm}_steps.csv")
    samples = read_csv(folder / f"{arm}_samples.csv")
    per_stat: dict[str, dict[int, float]] = {}
    for name in BIN_STATISTICS:
        per_stat[name] = worst_per_step(bins, get_statistic(name))
    ks: dict[int, list[float]] = defaultdict(list)
    for row in bins:
        if row.get("ks") is not None and row.get("counted") is not False:
            ks[int(row["step"])].append(row["ks"])
    per_stat["ks"] = {s: max(v) for s, v in ks.items()}
    tail = read_csv(folder / f"{arm}_tail.csv")  # seeds run before it was kept have none
    if tail:
        per_stat["p0.1"] = worst_tail_per_step(tail, bins)
    for key, column in (("S", "mismatch/sequence_mismatch_mean"), ("ess", "mismatch/ess")):
        per_stat[key] = {
            int(r["step"]): r[column] for r in steps if r.get(column) is not None and r["step"]
        }
    by_step: dict[int, list[dict]] = defaultdict(list)
    for row in samples:
        by_step[int(row["step"])].append(row)
    per_stat["seq_min"] = {
        s: float(np.mean([r["min_acceptance"] for r in rows if r["min_acceptance"] is not None]))
        for s, rows in by_step.items()
        if any(r["min_acceptance"] is not None for r in rows)
    }
    per_stat["S_lookup"] = {
        s: float(np.mean([r["lookup_mismatch_sum"] for r in rows]))
        for s, rows in by_step.items()
        if all(r.get("lookup_mismatch_sum") is not None for r in rows)
    }
    if not per_stat["S_lookup"]:
        # seeds aggregated before sample_stats recorded it: the same mean, from the role table
        per_stat["S_lookup"] = mismatch_per_step_from_roles(
            roles, {s: len(rows) for s, rows in by_step.items()}, role="lookup"
        )
    out = {}
    for name, values in per_stat.items():
        for suffix, mean in _means(values).items():
            out[name + suffix] = mean
    return out


def role_statistics(roles: list[dict]) -> dict[str, dict[str, float]]:
    """Per token role, the pre-registered per-role p5 and share below 0.5 of one unit: the mean
    over steps 1-20 and over all steps of the step's value (roles: `<arm>_roles.csv`, tokens
    pooled over length bins; rows without a role, from other tasks, left out)."""
    per_role: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in roles:
        for column in ROLE_COLUMNS:
            if row.get("role") is not None and row.get(column) is not None:
                per_role[row["role"]][column][int(row["step"])] = row[column]
    return {
        role: {
            column + suffix: mean
            for column, values in columns.items()
            for suffix, mean in _means(values).items()
        }
        for role, columns in per_role.items()
    }


def seed_of(folder: Path) -> tuple[str, int]:
    """(variant, seed) of a seed folder named <variant>-s<seed>; any other name is one error."""
    found = re.fullmatch(r"(v\d+[a-z-]*)-s(\d+)", folder.name)
    if not found:
        raise SystemExit(f"{folder}: expected a folder named <variant>-s<seed>")
    return found.group(1), int(found.group(2))


def load_units(folders: list[Path]) -> tuple[list[Unit], dict[tuple[str, int], dict]]:
    """Every arm of every seed folder; and per (variant, seed) the arms' predicted cost
    ratios to dense (report/summary.json)."""
    units, costs = [], {}
    for folder in folders:
        variant, seed = seed_of(folder)
        summary = json.loads((folder / "summary.json").read_text())
        start = summary.get("start", {}).get("accuracy")
        for arm, entry in summary["arms"].items():
            steps = read_csv(folder / f"{arm}_steps.csv")
            roles = read_csv(folder / f"{arm}_roles.csv")
            evals = [
                (int(r["step"]), r["eval/accuracy"])
                for r in steps
                if r.get("eval/accuracy") is not None
            ]
            peak_step, peak = max(evals, key=lambda e: e[1]) if evals else (None, None)
            units.append(
                Unit(
                    variant=variant,
                    seed=seed,
                    arm=arm,
                    outcome=entry.get("outcome", {}).get("accuracy"),
                    gap=entry.get("gap_to_dense"),
                    start=start,
                    peak=peak,
                    peak_step=peak_step,
                    steps=int(entry.get("steps_done") or 0),
                    stats=unit_statistics(folder, arm, roles),
                    extra={
                        "divergence": divergence(steps),
                        "raised_early": raised_early(steps),
                        "roles": role_statistics(roles),
                    },
                )
            )
        costs[(variant, seed)] = _cost_ratios(folder / "report" / "summary.json")
    return units, costs


def _cost_ratios(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    arms = json.loads(path.read_text())["arms"]
    eflops = {a["arm"]: a.get("predicted_eflops_per_step") for a in arms}
    dense = eflops.get(DENSE)
    return {arm: value / dense for arm, value in eflops.items() if value and dense}


def analyse(units: list[Unit], costs: dict, resamples: int = RESAMPLES) -> dict:
    variants = sorted({u.variant for u in units})
    names = sorted({k for u in units for k in u.stats})
    sparse = sum(u.sparse for u in units)
    stored = {n: sum(f"{n}_all" in u.stats for u in units if u.sparse) for n in PARTLY_STORED}
    out: dict = {
        "variants": {},
        "not_stored": [n for n, count in stored.items() if not count],
        "partly_stored": {
            n: f"{count} of {sparse} sparse units"
            for n, count in stored.items()
            if 0 < count < sparse
        },
        "resamples": resamples,
    }
    for variant in variants:
        mine = [u for u in units if u.variant == variant]
        arms = sorted({u.arm for u in mine if u.arm != DENSE})
        ratio = {
            arm: _mean([costs.get((variant, u.seed), {}).get(arm) for u in mine if u.arm == arm])
            for arm in arms
        }
        out["variants"][variant] = {
            "units": [
                {
                    "seed": u.seed,
                    "arm": u.arm,
                    "steps": u.steps,
                    "outcome": u.outcome,
                    "gap": u.gap,
                    "start": u.start,
                    "peak": u.peak,
                    "peak_step": u.peak_step,
                    "label": label(u),
                    "flag": "under 100 steps" if u.steps < 100 else None,
                    "divergence": u.extra.get("divergence"),
                    "raised_early": u.extra.get("raised_early"),
                    "roles": u.extra.get("roles", {}),
                }
                for u in sorted(mine, key=lambda u: (u.seed, u.arm))
            ],
            "a_predictors": [predictor(mine, name, resamples) for name in names],
            "a_against_p5": [
                auc_difference(mine, name, "p5_first20", resamples)
                for name in names
                if name != "p5_first20"
            ],
            "b_non_inferior": [non_inferior(mine, arm, ratio[arm]) for arm in arms],
            "c_rule": rule_sufficient(mine),
            "inconclusive": inconclusive(mine),
            # docs/study.md's twelfth addendum: read on seeds 1 and 2 only
            "secondary": {
                "tis": tis_question(mine),
                "raise": raise_question(mine),
                "divergence": divergence_question(mine),
            },
        }
    if {"v2", "v3"} <= set(variants):
        v2 = [u for u in units if u.variant == "v2"]
        v3 = [u for u in units if u.variant == "v3"]
        out["a_transfer_v2_to_v3"] = [transfer(v2, v3, name) for name in names]
    return out


def _mean(values) -> float | None:
    found = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(found)) if found else None


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"[{fmt(value[0])}, {fmt(value[1])}]"
    return str(value)


def markdown_table(header: list[str], rows) -> list[str]:
    """A markdown table's lines: the header, its rule, one line per row of cells."""
    return [
        f"| {' | '.join(header)} |",
        "|" + "---|" * len(header),
        *(f"| {' | '.join(str(cell) for cell in row)} |" for row in rows),
    ]


def markdown(result: dict) -> str:
    lines = ["# Study analysis (pre-registered, docs/study.md)", ""]
    if result.get("excluded_arms"):
        lines[0] = "# Study analysis: exploratory, NOT the pre-registered reading"
        lines.append(f"Arms left out of every table: {', '.join(result['excluded_arms'])}.")
    lines.append(f"Bootstrap: {result['resamples']} resamples of seeds.")
    if result["not_stored"]:
        lines.append(f"Not stored, so not computed: {', '.join(result['not_stored'])}.")
    for name, where in result.get("partly_stored", {}).items():
        lines.append(f"{name}: stored for {where} only; its rows cover those units alone.")
    for variant, data in result["variants"].items():
        lines += ["", f"## {variant}", ""]
        lines += markdown_table(
            ["seed", "arm", "steps", "outcome", "gap", "label", "divergence", "raised by 5"],
            (
                [u["seed"], u["arm"], u["steps"], fmt(u["outcome"]), fmt(u["gap"]),
                 f"{u['label'] or 'missing'}{' (flagged)' if u['flag'] else ''}",
                 fmt(u["divergence"]), fmt(u["raised_early"])]
                for u in data["units"]
            ),
        )  # fmt: skip
        lines += _roles(data["units"])
        lines += ["", '### (a) statistics for "not stable"', ""]
        against = {d["other"]: d for d in data["a_against_p5"]}
        lines += markdown_table(
            ["statistic", "units (not stable)", "AUC [95% CI]", "Spearman with gap [CI]",
             "AUC - p5_first20's [paired CI]"],
            (
                [p["statistic"], f"{p['units']} ({p['not_stable']})",
                 f"{fmt(p['auc'])} {fmt(p['auc_ci'])}",
                 f"{fmt(p['spearman'])} {fmt(p['spearman_ci'])}",
                 "(the base)" if p["statistic"] == "p5_first20" else
                 f"{fmt(against.get(p['statistic'], {}).get('difference'))} "
                 f"{fmt(against.get(p['statistic'], {}).get('ci'))}"]
                for p in data["a_predictors"]
            ),
        )  # fmt: skip
        lines += ["", "### (b) non-inferiority", ""]
        lines += markdown_table(
            ["arm", "gaps", "one-sided 95% lower", "cost / dense", "non-inferior"],
            (
                [b["arm"], ", ".join(fmt(g) for g in b["gaps"]), fmt(b["gap_lower_95"]),
                 fmt(b["cost_ratio"]), b["non_inferior"]]
                for b in data["b_non_inferior"]
            ),
        )  # fmt: skip
        c = data["c_rule"]
        lines += ["", "### (c)", "", f"rule-0.86 stable {c['rule_stable'][0]} of {c['rule_stable'][1]}, "
                  f"centroid-0.86 {c['centroid_stable'][0]} of {c['centroid_stable'][1]}: "
                  f"{c['answer']}"]  # fmt: skip
        reasons = data["inconclusive"]
        lines.append(
            f"Inconclusive: {'; '.join(reasons) if reasons else 'no pre-registered reason'}"
        )
        lines += _secondary(data["secondary"], data["units"])
    if "a_transfer_v2_to_v3" in result:
        lines += ["", "## Transfer of Youden's threshold, V2 to V3", ""]
        lines += markdown_table(
            [
                "statistic",
                "share of V3 units labelled right",
                "transfers",
                "V3's sparse units all one label",
                "V3's dense units called stable",
            ],
            (
                [
                    t["statistic"],
                    fmt(t["share_right"]),
                    t.get("transfers", "-"),
                    t.get("one_label", "-"),
                    fmt(t.get("dense_stable")),
                ]
                for t in result["a_transfer_v2_to_v3"]
            ),
        )
        if any(t.get("one_label") for t in result["a_transfer_v2_to_v3"]):
            lines += [
                "",
                "Every sparse V3 unit has one label: a share labelled right says nothing apart"
                " from it; read the dense column (twentieth addendum).",
            ]
    return "\n".join(lines) + "\n"


def _roles(units: list[dict]) -> list[str]:
    """The per-role p5 and share below 0.5 of every unit (mean over all its steps)."""
    present = {role for u in units for role in u["roles"]}
    roles = [role for role in ROLE_ORDER if role in present]
    if not roles:
        return []
    header = ["seed", "arm", "label"] + [f"{r} p5" for r in roles] + [f"{r} <0.5" for r in roles]
    rows = (
        [u["seed"], u["arm"], u["label"] or "missing"]
        + [fmt(u["roles"].get(r, {}).get(f"{c}_all")) for c in ROLE_COLUMNS for r in roles]
        for u in units
    )
    return [
        "",
        "### Per token role: p5 and share below 0.5 (mean over all steps; steps 1-20 in the JSON)",
        "",
        *markdown_table(header, rows),
    ]


def _secondary(sec: dict, units: list[dict]) -> list[str]:
    """The twelfth addendum's three questions (seeds 1 and 2 count; seed 0 is shown)."""
    tis, raise_, div = sec["tis"], sec["raise"], sec["divergence"]
    diffs = ", ".join(f"s{s}: {fmt(d)}" for s, d in sorted(tis["differences"].items()))
    return [
        "",
        "### Secondary (twelfth addendum; seeds 1 and 2 count)",
        "",
        f"- TIS off at 0.75, notis - centroid outcome ({diffs or 'none'}): {tis['answer']}",
        f"- centroid arms stable exactly when raised by step 5 ({raise_['units']} units; "
        f"breaks: {', '.join(raise_['breaks']) or 'none'}): {raise_['answer']}",
        f"- divergence above 0.3 ({div['above_bar']} of {div['units']} units; AUC "
        f"{fmt(div['auc'])}): {div['answer']}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--resamples", type=int, default=RESAMPLES)
    p.add_argument(
        "--exclude-arms",
        default="",
        help="comma-separated arms left out of every table (an exploratory reading, not the "
        "pre-registered one; the output says which arms were left out)",
    )
    args = p.parse_args()
    units, costs = load_units(args.folders)
    excluded = sorted({a.strip() for a in args.exclude_arms.split(",") if a.strip()})
    unknown = sorted(set(excluded) - {u.arm for u in units})
    if unknown:
        p.error(f"--exclude-arms names {unknown}, not arms of these folders")
    if DENSE in excluded:
        p.error(f"--exclude-arms cannot leave out {DENSE}: every gap is measured against it")
    units = [u for u in units if u.arm not in excluded]
    result = analyse(units, costs, args.resamples)
    if excluded:
        result["excluded_arms"] = excluded
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "analysis.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "analysis.md").write_text(markdown(result))
    print(args.out / "analysis.md")


if __name__ == "__main__":
    main()
