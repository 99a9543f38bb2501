"""`sparrow schedule`: (being written)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("schedule", help="(not yet available)")
