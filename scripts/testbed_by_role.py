"""Where a testbed model's hop lines fail: teacher-forced argmax accuracy by token role
(lookup, local, answer) and the per-hop-line accuracy, at several task sizes.

    python scripts/testbed_by_role.py /tmp/tb-v2 --sizes 8:1:4,16:3:4,32:7:4 --out by_role.json

Each size is NAMES:HOPS:CHAINS of multi_chase, on --prompts held-out prompts (the
"by-role" stream). A model that copies the current name but has not learnt the lookup in the
definitions reads "local" near 1 and "lookup" near 1 / NAMES (docs/testbed.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparrow.experiments.testbed.data import held_out_examples  # noqa: E402
from sparrow.experiments.testbed.evaluate import teacher_forced_accuracy  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--sizes", default="8:1:4,16:3:4,32:7:4", help="NAMES:HOPS:CHAINS,...")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    rows = []
    for size in args.sizes.split(","):
        names, hops, chains = (int(part) for part in size.split(":"))
        examples = held_out_examples(names, hops, args.prompts, args.seed, "by-role", chains)
        with torch.no_grad():
            result = teacher_forced_accuracy(model, examples)
        rows.append(
            dict(names=names, hops=hops, chains=chains, prompts=args.prompts)
            | {"hop": result["hop"], "argmax_by_role": result["argmax_by_role"]}
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
