"""`sparrow query [--workdir DIR] [--json|--csv] "SQL"`: read-only SQL over the mismatch history.

    sparrow query "SELECT step, bin, p5 FROM bin_stats WHERE p5 < 0.86 AND step > 300"

Tables: runs, stage_runs, schedules, bin_stats, threshold_events, step_metrics, calibration;
view token_mismatch over the per-token Parquet files (docs/storage.md).
"""

from __future__ import annotations

import argparse

from sparrow_cli.output import print_csv, print_json, print_table
from sparrow_core.config.schema import PipelineConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("query", help="read-only SQL over a workdir's DuckDB file")
    parser.add_argument("sql", help="one or more read statements (SELECT, EXPLAIN, DESCRIBE)")
    parser.add_argument(
        "--workdir", default=PipelineConfig.workdir, help="the run's pipeline.workdir"
    )
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print a list of row objects")
    form.add_argument("--csv", action="store_true", help="print CSV with a header row")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from storage import query

    result = query(args.workdir, args.sql)
    rows = result.as_dicts()
    if args.json:
        print_json(rows)
    elif args.csv:
        print_csv(rows)
    else:
        print_table(rows)
    return 0
