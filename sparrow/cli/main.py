"""`sparrow`: the command line.

    sparrow schedule list
    sparrow costmodel --model qwen3-1.7b --schedule qwen3-1.7b-0.86 --json
    sparrow config show algo.lr=2e-6
    sparrow --version

Each subcommand lives in sparrow/cli/commands/<name>.py and exposes `add_parser(subparsers)`,
which registers its arguments and sets `func(args) -> int`. A SparrowError anywhere becomes
one line on stderr and exit status 2; a SparrowWarning (a damaged file skipped) one line
`warning: ...` on stderr; Ctrl-C one line `interrupted ...` and exit status 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from sparrow import __version__
from sparrow.errors import SparrowError, SparrowWarning

COMMANDS = (
    "config",
    "schedule",
    "mismatch",
    "costmodel",
    "generate",
    "query",
    "report",
    "train",
    "runs",
    "calibrate",
    "study",
    "export",
    "ui",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparrow",
        description="Sparse-rollout RL training with a mismatch-controlled schedule.",
    )
    parser.add_argument("--version", action="version", version=f"sparrow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"sparrow.cli.commands.{name}")
        module.add_parser(subparsers)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, SparrowWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line; key=value overrides may also follow options
    (`sparrow study run s1 --gpus 0,1 pipeline.steps=8`), in the order given."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    args = parse_args(build_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except SparrowError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sparrow ... | head`
        return 0
    except KeyboardInterrupt:
        # Ctrl-C: one line, not the traceback of whatever was running
        hint = (
            (
                " (the run is resumable: `sparrow runs` lists it, `sparrow train "
                "pipeline.run_id=ID` resumes it)"
            )
            if args.command == "train"
            else ""
        )
        print(f"interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
