"""`sparrow export RUN_ID OUT [--step N]`: a run's policy as a clean bf16 Hugging Face folder.

    sparrow export run-20261121-1952-3f2a /models/qwen3-rl --step 40 --workdir /runs/q17
    sparrow export run-20261121-1952-3f2a /models/qwen3-rl           # the newest step
    sparrow export RUN_ID OUT --dtype float32 --json

The folder holds the weights (safetensors, in --dtype, bfloat16 by default), config.json,
generation_config.json and the tokenizer files; no optimizer or trainer state. transformers
and vLLM load it as they load the model the run started from (sparrow/trainer/export.py).
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json
from sparrow.config.schema import PipelineConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write a run's policy as a clean Hugging Face folder (bf16, no optimizer)"
    )
    parser.add_argument("run_id", metavar="RUN_ID")
    parser.add_argument("out", metavar="OUT", help="output folder (must be new or empty)")
    parser.add_argument(
        "--step", type=int, default=None, metavar="N", help="the step's policy (default: newest)"
    )
    parser.add_argument("--workdir", default=PipelineConfig.workdir, help="the run's workdir")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow.trainer.export import export_policy, find_policy_folder

    source = find_policy_folder(args.workdir, args.run_id, args.step)
    out = export_policy(source, args.out, args.dtype)
    if args.json:
        print_json({"run_id": args.run_id, "source": str(source), "out": str(out)})
    else:
        print(f"exported {source} to {out} ({args.dtype})")
    return 0
