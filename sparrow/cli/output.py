"""Printing helpers shared by the subcommands: JSON, CSV and rich tables."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
import sys
import uuid
from collections.abc import Iterable, Sequence
from typing import Any


def _clean(value: Any) -> Any:
    # JSON has no NaN; a statistic that is undefined prints as null
    if isinstance(value, float) and not math.isfinite(value):
        return None
    # what DuckDB hands back beside numbers and strings: timestamps as ISO 8601 text
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return _clean(float(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _clean(value.item())
    return value


def print_json(data: Any) -> None:
    json.dump(_clean(data), sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_csv(rows: Sequence[dict]) -> None:
    if not rows:
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(_clean(list(rows)))


def print_table(rows: Iterable[dict], title: str | None = None, digits: int = 4) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    table = Table(title=title)
    # rich assumes 80 columns when piped; a log or `| less` should keep whole cells
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not rows:
        console.print(title or "", "(no rows)")
        return
    for column in rows[0]:
        table.add_column(str(column), justify="right")
    for row in rows:
        table.add_row(*(_format(v, digits) for v in row.values()))
    console.print(table)


def _format(value: Any, digits: int) -> str:
    value = _clean(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return (
            f"{value:.{digits}g}"
            if abs(value) >= 1e5 or 0 < abs(value) < 1e-3
            else f"{value:.{digits}f}"
        )
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def int_at_least(minimum: int):
    """An argparse `type` for whole numbers >= minimum, with a one-line error otherwise."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse
