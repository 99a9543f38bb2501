"""`sparrow config show [key=value ...]`: print the resolved, validated configuration."""

from __future__ import annotations

import argparse

from sparrow_core.config import load_config, to_yaml


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="show the resolved configuration")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print the config after defaults and overrides")
    show.add_argument("overrides", nargs="*", metavar="key=value")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    print(to_yaml(load_config(args.overrides)), end="")
    return 0
