"""`sparrow mismatch`: (being written)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("mismatch", help="(not yet available)")
