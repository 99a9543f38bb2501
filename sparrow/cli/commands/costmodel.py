"""`sparrow costmodel`: predicted rollout speedup of a schedule by the eFLOPs cost model.

    sparrow costmodel --model qwen3-1.7b --schedule qwen3-1.7b-0.86 --prompt-len 1024 \\
        --gen-len 32768 --samples 8 --hardware h200 [--variant paper|appendix] [--json]

--schedule takes a preset name or a schedule file. The JSON holds the inputs, dense_eflops,
sparse_eflops, predicted_speedup, both costs split into compute and memory, and one row per
length bin. The formulas and their approximations: docs/costmodel.md.
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json, print_table
from sparrow.costmodel import (
    HARDWARE,
    MODELS,
    VARIANTS,
    get_hardware,
    get_model,
    schedule_cost,
)
from sparrow.sparse.io import resolve_schedule

# per-bin table headers, short enough to fit 80 columns
BIN_LABELS = {
    "bin": "bin",
    "start_position": "from",
    "end_position": "to",
    "topk_pages": "top-k",
    "budget_tokens": "budget",
    "dense_tokens": "dense",
    "dense_eflops": "dense eFLOPs",
    "sparse_eflops": "sparse eFLOPs",
    "speedup": "speedup",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("costmodel", help="predicted speedup of a schedule (eFLOPs)")
    parser.add_argument("--model", default="qwen3-1.7b", help=f"one of: {', '.join(MODELS)}")
    parser.add_argument(
        "--schedule", default="qwen3-1.7b-0.86", help="a preset name or a schedule file"
    )
    parser.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens L_in")
    parser.add_argument("--gen-len", type=int, default=32768, help="generated tokens L_out")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt N")
    parser.add_argument("--hardware", default="h200", help=f"one of: {', '.join(HARDWARE)}")
    parser.add_argument("--variant", default="paper", help=f"one of: {', '.join(VARIANTS)}")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model, hardware = get_model(args.model), get_hardware(args.hardware)
    schedule = resolve_schedule(args.schedule)
    result = schedule_cost(
        schedule,
        model=model,
        hardware=hardware,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        samples=args.samples,
        variant=args.variant,
    )
    inputs = {
        "schedule_spec": args.schedule,
        "params": model.parameters,
        "kv_dim": model.kv_dim,
        "gqa_ratio": model.gqa_ratio,
        "intensity": hardware.intensity,
        "page_size": schedule.page_size,
        "bin_tokens": schedule.bin_tokens,
        "reserved_pages": schedule.reserved_pages(),
    }
    data = result.to_dict()
    # the named inputs (schedule, model, ..., samples) lead; the derived symbols follow them
    data = {**{k: data.pop(k) for k in list(data)[:7]}, "inputs": inputs, **data}
    if args.json:
        print_json(data)
        return 0
    print(
        f"{model.name} on {hardware.name} (I = {hardware.intensity:.1f} FLOP/byte), "
        f"schedule {schedule.name}, {args.variant} variant"
    )
    print(
        f"P = {model.parameters:,}, D = {model.kv_dim:,} (layers x KV heads x head dim), "
        f"r = {model.gqa_ratio:g}, L_in = {args.prompt_len}, L_out = {args.gen_len}, "
        f"N = {args.samples}"
    )
    rows = [{BIN_LABELS[k]: v for k, v in row.items() if k in BIN_LABELS} for row in data["bins"]]
    print_table(rows, digits=3)
    print(
        f"dense {result.dense.total:.4g} eFLOPs, sparse {result.sparse.total:.4g} eFLOPs, "
        f"predicted speedup {result.predicted_speedup:.3f}x"
    )
    return 0
