"""`sparrow`: the command line.

    sparrow schedule list
    sparrow costmodel --model qwen3-1.7b --schedule qwen3-1.7b-0.86 --json
    sparrow config show algo.lr=2e-6

Each subcommand lives in sparrow_cli/commands/<name>.py and exposes `add_parser(subparsers)`,
which registers its arguments and sets `func(args) -> int`. A SparrowError anywhere becomes
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sparrow_core.errors import SparrowError

COMMANDS = ("config", "schedule", "mismatch", "costmodel", "generate", "query", "report", "train", "runs",
            "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparrow", description="Sparse-rollout RL training with a mismatch-controlled schedule."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"sparrow_cli.commands.{name}")
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SparrowError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sparrow ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
