"""`sparrow generate`: (being written)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("generate", help="(not yet available)")
