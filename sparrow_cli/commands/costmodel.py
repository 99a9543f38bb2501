"""`sparrow costmodel`: (being written)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("costmodel", help="(not yet available)")
