"""Which tokens of a chase line a sparse rule gets wrong: the offline selection replay of
benchmarks/selection_study.py on a few held-out prompts, counting tokens with acceptance
below 0.5 by (role, column in the hop line). A probe for docs/selection.md's question "which
local tokens fall under 0.5", on any device (CPU: about a minute for 8 prompts of v2).

    python benchmarks/probes/selection_columns.py --model DIR --prompts 8 \
        --cells quest:16,quest:48,centroid:48,centroid:96 --out columns.json

A v2 hop line is `181 ao=rd` + newline, one token each: columns 0-2 the countdown's digits,
3 a space, 4 the current name, 5 `=`, 6 the target (the lookup), 7 the newline.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import selection_study as study  # noqa: E402

from benchmarks.common import device_facts, write_json  # noqa: E402
from sparrow.experiments.testbed.selection_replay import dense_pass, sparse_pass  # noqa: E402
from sparrow.model import load_model, load_tokenizer  # noqa: E402
from sparrow.sparse.presets import get_preset  # noqa: E402


def columns(seq, tokenizer) -> list[int]:
    """Each generated token's column in its line (0 after a newline)."""
    out, column = [], 0
    for token in seq.ids[seq.prompt_len :]:
        out.append(column)
        column = 0 if tokenizer.decode([token]) == "\n" else column + 1
    return out


def count(seqs, cells, tokenizer) -> list[dict]:
    below, total = collections.Counter(), collections.Counter()
    for seq, cell in zip(seqs, cells):
        for j, (role, column) in enumerate(zip(seq.roles, columns(seq, tokenizer))):
            total[role, column] += 1
            below[role, column] += bool(cell.acceptance[j] < 0.5)
    return [
        {"role": role, "column": column, "below_half": below[role, column], "tokens": n}
        for (role, column), n in sorted(total.items())
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--task", default="builtin:multi_chase:num_defs=256,num_hops=63,chains=4")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--cells", default="quest:16,quest:48,centroid:48,centroid:96")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    replay = study.parse_args(["--model", args.model, "--task", args.task,
                               "--prompts", str(args.prompts)])  # fmt: skip
    device = torch.device(replay.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = load_model(args.model, dtype=dtype, device=device).eval()
    tokenizer = load_tokenizer(args.model)
    examples, _ = study.prompts_of(replay)
    seqs = study.build_sequences(replay, model, tokenizer, examples)
    template = get_preset(replay.schedule)
    dense = dense_pass(model, seqs, [args.page_size])
    cells = []
    for cell in args.cells.split(","):
        rule, topk = cell.split(":")
        schedule = study.cell_schedule(template, args.page_size, rule, int(topk))
        replayed = sparse_pass(model, seqs, schedule, dense.logits, replay.centroid_dtype)
        cells.append(
            {"rule": rule, "topk_pages": int(topk), "counts": count(seqs, replayed, tokenizer)}
        )
    write_json(args.out, {"probe": "selection_columns", "facts": device_facts(), "args": vars(args),
                          "sequences": len(seqs), "page_size": args.page_size, "cells": cells})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
