"""One seed's folder from the holds it was split over (docs/study.md, sixth addendum): each
hold ran some of the seed's arms with `ARMS=... scripts/study_seed.sh` and brought back a
folder like a whole seed's; the analysis (scripts/study_analysis.py) wants one folder per seed.

    python scripts/study_merge_holds.py results/v2-s0-holdA results/v2-s0-holdB --out results/v2-s0

Every hold must be of the same study id (variant and seed), of the same starting weights
where its model.json names them (scripts/study_seed.sh writes it), and no arm may be in two holds.
The merged folder has every arm's CSVs as its hold wrote them; summary.json with every arm,
each gap to dense computed again against the dense arm's outcome (whichever hold ran it), the
start scored by the dense arm's hold (each hold's own start is kept under `holds`); and
report/summary.json with every hold's arms (the predicted costs). Calibration depends only on
the seed, the model and the rule, and the holds calibrate the same rules (centroid and the
rule arms'), so each measured table of a hold (top-k, bin, tokens, p1, p5, p10, mean) must
equal one of the other holds': summary.json says per hold whether every one did
(`calibration_reproduced`) and how many did (`calibration_tables_shared`, of
`calibration_tables`), and the script prints both: a hold that alone ran a rule (its table has
no counterpart) shows as not reproduced with its other tables counted. The
output folder must not exist yet: nothing already written is replaced.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

from sparrow.experiments.study_analysis import DENSE, set_gaps_to_dense

MEASURED = ("topk_pages", "bin", "n", "p1", "p5", "p10", "mean")


def calibration_tables(folder: Path) -> set[tuple]:
    """The distinct measured tables of a hold's calibration.csv (ids and times left out)."""
    path = folder / "calibration.csv"
    if not path.exists():
        return set()
    tables: dict[str, list[tuple]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            tables.setdefault(row["calibration_id"], []).append(tuple(row[k] for k in MEASURED))
    return {tuple(sorted(rows)) for rows in tables.values()}


def merge(holds: list[Path], out: Path) -> dict:
    if out.exists():
        raise SystemExit(f"{out}: already exists; the merge writes a new folder only")
    summaries = []
    for hold in holds:
        path = hold / "summary.json"
        if not path.exists():
            raise SystemExit(f"{hold}: no summary.json (not a folder scripts/study_seed.sh wrote)")
        summaries.append(json.loads(path.read_text()))
    ids = {s["study_id"] for s in summaries}
    if len(ids) != 1:
        raise SystemExit(f"the holds are of different studies: {sorted(ids)}")
    weights = {}
    for hold in holds:
        record = hold / "model.json"
        if record.exists():
            sha = json.loads(record.read_text()).get("model_safetensors_sha256")
            weights.setdefault(sha, []).append(str(hold))
    if len(weights) > 1:
        named = "; ".join(f"{sha} in {', '.join(folders)}" for sha, folders in weights.items())
        raise SystemExit(f"the holds started from different weights: {named}")
    owner: dict[str, Path] = {}
    for hold, summary in zip(holds, summaries):
        for arm in summary["arms"]:
            if arm in owner:
                raise SystemExit(f"arm {arm} is in two holds: {owner[arm]} and {hold}")
            owner[arm] = hold
    tables = [calibration_tables(hold) for hold in holds]
    out.mkdir(parents=True)
    merged = {"study_id": ids.pop(), "variant": summaries[0].get("variant"), "arms": {}}
    if weights:
        merged["model_safetensors_sha256"] = next(iter(weights))
    merged["holds"] = []
    for i, (hold, summary) in enumerate(zip(holds, summaries)):
        others = set().union(*(t for j, t in enumerate(tables) if j != i))
        merged["holds"].append(
            {
                "folder": str(hold),
                "arms": sorted(summary["arms"]),
                "start": summary.get("start"),
                "calibration_tables": len(tables[i]),
                # this hold's tables that another hold measured identically; a table of a
                # rule no other hold calibrated has nothing to be compared with
                "calibration_tables_shared": len(tables[i] & others),
                # every table of this hold measured identically by another hold
                "calibration_reproduced": bool(tables[i]) and tables[i] <= others,
            }
        )
        merged["arms"].update(summary["arms"])
        for arm in summary["arms"]:
            for csv_path in sorted(hold.glob(f"{arm}_*.csv*")):  # .csv and .csv.gz
                shutil.copy2(csv_path, out / csv_path.name)
        if DENSE in summary["arms"] and "start" in summary:
            merged["start"] = summary["start"]
    set_gaps_to_dense(merged["arms"])
    (out / "summary.json").write_text(json.dumps(merged, indent=2) + "\n")
    reports = [hold / "report" / "summary.json" for hold in holds]
    report_arms = [a for r in reports if r.exists() for a in json.loads(r.read_text())["arms"]]
    (out / "report").mkdir()
    (out / "report" / "summary.json").write_text(
        json.dumps({"study_id": merged["study_id"], "arms": report_arms}, indent=2) + "\n"
    )
    return merged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("holds", nargs="+", type=Path, help="the holds' folders")
    p.add_argument("--out", type=Path, required=True, help="the seed's folder (new)")
    args = p.parse_args()
    if len(args.holds) < 2:
        raise SystemExit("name two or more holds")
    merged = merge(args.holds, args.out)
    for hold in merged["holds"]:
        print(
            f"{hold['folder']}: arms {', '.join(hold['arms'])}; calibration "
            f"{'reproduced' if hold['calibration_reproduced'] else 'NOT reproduced'} "
            f"({hold['calibration_tables_shared']} of {hold['calibration_tables']} distinct "
            "tables equal to another hold's)"
        )
    print(f"{args.out}: {len(merged['arms'])} arms", file=sys.stderr)


if __name__ == "__main__":
    main()
