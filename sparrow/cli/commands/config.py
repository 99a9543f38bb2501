"""`sparrow config show [--json] [key=value ...]`: print the resolved, validated configuration.

sparrow config show algo.lr=2e-6              # YAML, as the run records it
sparrow config show --json | jq .algo.lr      # the same tree as JSON
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json
from sparrow.config import load_config, to_yaml


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="show the resolved configuration")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print the config after defaults and overrides")
    show.add_argument("overrides", nargs="*", metavar="key=value")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.overrides)
    if args.json:
        from omegaconf import OmegaConf

        print_json(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    else:
        print(to_yaml(cfg), end="")
    return 0
