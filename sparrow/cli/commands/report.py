"""`sparrow report RUN_ID [--workdir DIR] [--out DIR] [--step N] [--json]`: plots and a summary of a run.

    sparrow report run-20260101-abc                      # into <workdir>/reports/<run id>/
    sparrow report run-20260101-abc --out ./report --step 40 --json

Reads the workdir's DuckDB file read-only (a running flow may keep writing) and writes PNG
plots (p5 per bin over steps against the target, reward and response length, the acceptance
histogram of the last step, or of --step, with the Beta fit of its tail), summary.png and
summary.md; then prints the paths, one a line, or with --json an object holding the paths
and the summary's numbers. docs/tracking.md shows a sample.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparrow.cli.output import int_at_least, print_json
from sparrow.config.schema import PipelineConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="PNG plots and a one-page summary of a run")
    parser.add_argument(
        "run_id", metavar="RUN_ID", help="the run's pipeline.run_id (sparrow runs lists them)"
    )
    parser.add_argument(
        "--workdir", default=PipelineConfig.workdir, help="the run's pipeline.workdir"
    )
    parser.add_argument(
        "--out", default=None, help="output folder (default <workdir>/reports/<RUN_ID>)"
    )
    parser.add_argument(
        "--step",
        type=int_at_least(0),
        default=None,
        help="step of the acceptance histogram (default: the last with token rows)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the paths and summary numbers as JSON"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow.reports.run import write_report

    out = Path(args.out) if args.out else Path(args.workdir) / "reports" / args.run_id
    paths, summary = write_report(args.workdir, args.run_id, out, step=args.step)
    if args.json:
        print_json(
            {
                "run_id": args.run_id,
                "out_dir": str(out),
                "files": [str(p) for p in paths],
                "summary": summary,
            }
        )
    else:
        for path in paths:
            print(path)
    return 0
