"""The fair test's summary (docs/distill.md, "A fair test"; the verdict is
sparrow/experiments/distill_fair.py's) over the seeds' JSON from benchmarks/distill.py.

    python scripts/distill_fair_summary.py out/seed-0.json out/seed-1.json out/seed-2.json \
        --out out/summary.json

A file's seed is its `args.seed`. Prints one line per seed and the verdicts; writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparrow.experiments.distill_fair import seed_row, verdict


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
            rows.append(seed_row(int(report["args"]["seed"]), report))
        except (OSError, ValueError, KeyError) as err:
            print(f"{path}: not a benchmarks/distill.py report with a fixed set ({err!r})")
            return 2
    rows.sort(key=lambda r: r["seed"])
    summary = {"seeds": rows, "verdict": verdict(rows)}
    for r in rows:
        print(
            f"seed {r['seed']}: p5 with - without the LoRA {r['delta']:+.4f} "
            f"[{r['low']:+.4f}, {r['high']:+.4f}], with the LoRA {r['p5_lora']:.4f}"
        )
    print(json.dumps(summary["verdict"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
