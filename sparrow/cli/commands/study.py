"""`sparrow study`: run (or resume) a stability study, and report on one from DuckDB.

    sparrow study run s1 pipeline.steps=8                       # sparrow/conf/study/default.yaml's arms
    sparrow study run s1 --study my_study.yaml study.fixed_topk_pages=4 pipeline.steps=2
    sparrow study run s1 pipeline.steps=8                       # again: finished arms skipped,
                                                                # an unfinished one resumed
    sparrow study run s1 --arm dense pipeline.steps=8           # only this arm (--arm again: more)
    sparrow study run s1 --gpus 0,1,2,3 study.own_workdirs=true pipeline.steps=8
                                                                # the arms at once, one per GPU
    sparrow study report s1 [--workdir DIR] [--out DIR] [--json] [--collapse-window N]

`run` takes train overrides (key=value, group=name) that every arm gets, and `study.KEY=VALUE`
for a field of the study's YAML (sparrow/config/study.py); each arm is the train flow with
run id <study_id>-<arm>, and the report is written into <workdir>/studies/<study_id>/report/.
`--arm` runs the named arms only and writes no report; `--gpus` runs every unfinished arm at
once, one process per GPU (sparrow/flows/study.py, study_at_once), each arm in its own workdir.
`report` reads the workdir's DuckDB file read-only and writes plots, summary.json and
summary.md into --out (default the same folder); --collapse-window and --collapse-ratio
replace the study's collapse rule for this report. docs/study-tool.md explains both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparrow.cli.output import int_at_least, print_json, print_table
from sparrow.config.schema import PipelineConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("study", help="run a stability study, report on one")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    run_parser = actions.add_parser("run", help="run or resume every arm of a study")
    run_parser.add_argument(
        "study_id", metavar="STUDY_ID", help="the study's id: arms run as <STUDY_ID>-<arm>"
    )
    run_parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="train overrides for every arm; study.KEY=VALUE sets the study",
    )
    run_parser.add_argument(
        "--study",
        default="default",
        help="a study of sparrow/conf/study/ or a YAML file (default: default)",
    )
    run_parser.add_argument(
        "--arm",
        action="append",
        default=None,
        metavar="ARM",
        help="run this arm only (repeat for more); no report is written",
    )
    run_parser.add_argument(
        "--gpus",
        default=None,
        type=_gpu_list,
        metavar="0,1,...|all",
        help="run the arms at once, one process per GPU listed (an index "
        "twice: two arms there; all: every visible GPU); needs "
        "study.own_workdirs=true",
    )
    run_parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    run_parser.set_defaults(func=run_study)
    report = actions.add_parser("report", help="plots and a summary of a study, from DuckDB")
    report.add_argument("study_id", metavar="STUDY_ID")
    report.add_argument("--workdir", default=PipelineConfig.workdir, help="the study's workdir")
    report.add_argument(
        "--out", default=None, help="output folder (default <workdir>/studies/<STUDY_ID>/report)"
    )
    report.add_argument(
        "--collapse-window",
        type=int_at_least(1),
        default=None,
        help="final steps whose mean reward decides collapse (default: study's)",
    )
    report.add_argument(
        "--collapse-ratio",
        type=_ratio,
        default=None,
        help="collapsed below this x the reference arm's (default: study's)",
    )
    report.add_argument("--json", action="store_true", help="print the paths and summary as JSON")
    report.set_defaults(func=run_report)


def _gpu_list(text: str) -> list[str]:
    if text.strip() == "all":
        return _visible_gpus()
    gpus = [item.strip() for item in text.split(",") if item.strip()]
    if not gpus or not all(g.isdigit() for g in gpus):
        raise argparse.ArgumentTypeError(
            f"expected GPU indices like 0,1,2,3 (one repeated "
            f"runs two arms on that GPU), got {text!r}"
        )
    return gpus


def _visible_gpus() -> list[str]:
    """`--gpus all`: the GPUs this process sees (CUDA_VISIBLE_DEVICES's, else every one)."""
    import os

    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise argparse.ArgumentTypeError("--gpus all: this machine has no GPU that torch sees")
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    # a child's CUDA_VISIBLE_DEVICES names the parent's own numbering, as the list gave it
    return listed[:count] if listed else [str(i) for i in range(count)]


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """(train overrides, study overrides without their `study.` prefix)."""
    study = [item[len("study.") :] for item in items if item.startswith("study.")]
    return [item for item in items if not item.startswith("study.")], study


def run_study(args: argparse.Namespace) -> int:
    from sparrow.flows.prefect_env import quiet_prefect

    quiet_prefect()
    from sparrow.config import ConfigError
    from sparrow.config.study import check_arm_names, check_at_once, check_study_id, load_study

    overrides, study_overrides = split_overrides(args.overrides)
    check_study_id(args.study_id)
    study = load_study(args.study, study_overrides)  # a bad study is one error line, before Prefect
    check_arm_names(study, args.arm or [])
    if args.gpus and args.arm:
        raise ConfigError("--gpus runs every unfinished arm; leave out --arm")
    if args.gpus:
        check_at_once(study)
    from sparrow.flows.server_guard import guard_local_server
    from sparrow.runtime.interrupt import install_sigint

    guard_local_server()
    install_sigint()
    from sparrow.flows.study import study_at_once, study_flow

    if args.gpus:
        summary = study_at_once(args.study_id, args.study, overrides, study_overrides, args.gpus)
    else:
        summary = study_flow(
            args.study_id,
            args.study,
            overrides,
            study_overrides,
            show_table=not args.json,
            arms=args.arm,
        )
    if args.json:
        print_json(summary)
    else:
        print_table(summary["arms"], title=f"study {args.study_id}")
        if summary["report"]:
            print(f"report: {summary['report']}")
        else:
            print(f"report: sparrow study report {args.study_id} once every arm has run")
    failed = [a for a in summary["arms"] if a["status"] != "finished"]
    for arm in failed:
        print(
            f"arm {arm['arm']} {arm['status']}" + (f": see {arm['log']}" if arm.get("log") else ""),
            file=sys.stderr,
        )
    return 1 if failed else 0


def run_report(args: argparse.Namespace) -> int:
    from sparrow.reports.study import default_out, write_study_report

    out = Path(args.out) if args.out else default_out(args.workdir, args.study_id)
    paths, summary = write_study_report(
        args.workdir, args.study_id, out, args.collapse_window, args.collapse_ratio
    )
    if args.json:
        print_json(
            {
                "study_id": args.study_id,
                "out_dir": str(out),
                "files": [str(p) for p in paths],
                "summary": summary,
            }
        )
    else:
        for path in paths:
            print(path)
    return 0
