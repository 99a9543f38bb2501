"""`sparrow query [--workdir DIR] [--json|--csv] "SQL"`: read-only SQL over the mismatch history.

    sparrow query "SELECT step, bin, p5 FROM bin_stats WHERE p5 < 0.86 AND step > 300"
    sparrow query --json "SELECT * FROM schedules"          # timestamps as ISO 8601 text

Tables: runs, stage_runs, schedules, bin_stats, threshold_events, step_metrics, calibration;
view token_mismatch over the per-token Parquet files (docs/storage.md). Several statements
separated by `;` each print their result, in order: a table each, titled with its statement;
with --json, a list of {"statement", "rows"} objects (one statement: its rows alone); with
--csv, the sections one after another, separated by a blank line. The query cannot read files
outside the workdir's runs/ folder (sparrow/storage/query.py).
"""

from __future__ import annotations

import argparse
import sys

from sparrow.cli.output import print_csv, print_json, print_table
from sparrow.config.schema import PipelineConfig


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
    from sparrow.storage import query_all

    results = query_all(args.workdir, args.sql)
    several = len(results) > 1
    if args.json:
        if several:
            print_json([{"statement": r.statement, "rows": r.as_dicts()} for r in results])
        else:
            print_json(results[0].as_dicts())
        return 0
    for i, result in enumerate(results):
        if args.csv:
            if i:
                sys.stdout.write("\n")
            print_csv(result.as_dicts())
        else:
            print_table(result.as_dicts(), title=result.statement if several else None)
    return 0
