"""`sparrow mismatch`: per-bin acceptance statistics of a Parquet file of per-token rows.

    sparrow mismatch stats tokens.parquet
    sparrow mismatch stats tokens.parquet --bin-tokens 2000 --num-bins 20 --json

Reads the columns `position` (total position, integer >= 0) and `acceptance` (alpha in
[0, 1]); other columns are ignored. Prints one row per length bin that holds tokens: bin, n,
mean, p1, p5, p10, p50, beta_a, beta_b, beta_var, ks (docs/mismatch.md); the table leaves out
the mean to fit 80 columns. A Beta fit that could not be made (fewer than 20 tokens below
0.999) prints as null in JSON and "-" in the table.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sparrow.cli.output import int_at_least, print_json, print_table
from sparrow.errors import SparrowError

if TYPE_CHECKING:  # the statistics import torch; load them only when a file is read
    from sparrow.mismatch.acceptance import BinStats

COLUMNS = ("position", "acceptance")
ROW_KEYS = ("bin", "n", "mean", "p1", "p5", "p10", "p50", "beta_a", "beta_b", "beta_var", "ks")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("mismatch", help="acceptance-rate statistics of rollout tokens")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    stats = actions.add_parser("stats", help="per-bin acceptance statistics of a Parquet file")
    stats.add_argument(
        "file", metavar="FILE.parquet", help="per-token rows with position, acceptance"
    )
    stats.add_argument(
        "--bin-tokens",
        type=int_at_least(1),
        default=None,
        help="bin width in tokens of total position (default 2000, the method's bins)",
    )
    stats.add_argument(
        "--num-bins",
        type=int_at_least(1),
        default=None,
        help="put every position past the last bin into the last bin (default: no limit)",
    )
    stats.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    stats.set_defaults(func=run_stats)


def _column(table, path: Path, name: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise SparrowError(f"{path}: column {name!r} has type {column.type}; expected numbers")
    if column.null_count:
        first = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise SparrowError(
            f"{path}: column {name!r} has {column.null_count} null rows, first at row {first}"
        )
    return column.to_numpy()


def read_tokens(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(positions, acceptance) from a Parquet file; every problem is one SparrowError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise SparrowError(f"{path}: no such file")
    if not path.is_file():
        raise SparrowError(f"{path}: not a file")
    try:
        present = pq.read_schema(path).names
        missing = [name for name in COLUMNS if name not in present]
        if missing:
            raise SparrowError(
                f"{path}: missing column(s) {', '.join(missing)}; "
                f"columns present: {', '.join(present) or '(none)'}"
            )
        table = pq.read_table(path, columns=list(COLUMNS))
    except (pa.ArrowException, OSError) as err:
        raise SparrowError(f"{path}: not a readable Parquet file ({err})") from None
    return _column(table, path, "position"), _column(table, path, "acceptance")


def _fixed(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def table_row(stats: BinStats) -> dict[str, object]:
    """One table line; the mean is left out to keep 80 columns (the tail is what matters)."""
    return {
        "bin": stats.bin,
        "n": stats.n,
        "p1": _fixed(stats.p1),
        "p5": _fixed(stats.p5),
        "p10": _fixed(stats.p10),
        "p50": _fixed(stats.p50),
        "a": "-" if math.isnan(stats.beta_a) else f"{stats.beta_a:.3g}",
        "b": "-" if math.isnan(stats.beta_b) else f"{stats.beta_b:.3g}",
        "var": _fixed(stats.beta_var),
        "ks": _fixed(stats.ks),
    }


TABLE_LEGEND = (
    "a, b: Beta fit of the acceptance below 0.999, scaled to [0, 1]; var: its variance; "
    "ks: its Kolmogorov-Smirnov statistic; -: too few tokens below 0.999 to fit. "
    "--json gives full precision and the mean."
)


def run_stats(args: argparse.Namespace) -> int:
    from sparrow.mismatch.acceptance import BIN_TOKENS, MismatchError, bin_statistics

    bin_tokens = args.bin_tokens or BIN_TOKENS
    positions, acceptance = read_tokens(args.file)
    try:
        stats = bin_statistics(positions, acceptance, bin_tokens, args.num_bins)
    except MismatchError as err:  # bad data: name the file it came from
        raise SparrowError(f"{args.file}: {err}") from None
    if args.json:
        print_json([{key: getattr(s, key) for key in ROW_KEYS} for s in stats])
        return 0
    print_table(
        [table_row(s) for s in stats], title=f"{args.file}: acceptance per {bin_tokens}-token bin"
    )
    print(textwrap.fill(TABLE_LEGEND, width=80))
    return 0
