"""`sparrow calibrate [key=value ...]`: measure a sparsity schedule for a model (the Prefect
calibrate flow).

    sparrow calibrate                                   # the embedded tiny model, CPU, about a minute
    sparrow calibrate calibrate.num_prompts=2 calibrate.repeats=2 calibrate.topk_pages=[2,4,6,12]
    sparrow calibrate model.path=/models/Qwen3-1.7B schedule.name=qwen3-1.7b-0.86 \
        data.train=/data/aime.parquet schedule.target=0.86 calibrate.repeats=8
    sparrow calibrate --json

Takes the same model.* and pipeline.workdir keys as train. Prints the chosen top-k pages per
bin, the notes (bins that took a neighbour's decision), where the schedule, the plot and the
DuckDB rows went, and the time calibration took (against generating every budget with
calibrate.time_generation=true). Train with it: `sparrow train schedule.name=<name>`.
docs/calibration.md explains the method.
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json, print_table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="calibrate a sparsity schedule (the calibrate flow)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. calibrate.repeats=8 (sparrow config show)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow.flows.prefect_env import quiet_prefect

    quiet_prefect()
    from sparrow.config import load_config
    from sparrow.flows.server_guard import guard_local_server, start_local_server
    from sparrow.model.builtin import resolve_model_path
    from sparrow.sparse.io import resolve_schedule

    cfg = load_config(args.overrides)
    resolve_model_path(cfg.model.path)
    # a kill -9 of this process must not leave Prefect's temporary API server behind
    guard_local_server()
    from sparrow.runtime.interrupt import install_sigint

    install_sigint()
    resolve_schedule(cfg.schedule.name)
    # Prefect's API server, in a session of its own: Ctrl-C from a terminal reaches the whole
    # process group
    start_local_server()

    from sparrow.flows.calibrate import calibrate_flow

    # one line per phase on stderr: calibration takes minutes (21 on a busy 2-core machine)
    summary = calibrate_flow(list(args.overrides), progress=True)
    if args.json:
        print_json(summary)
        return 0
    print_summary(summary)
    return 0


def print_summary(summary: dict) -> None:
    rows = [
        {"bin": i, "topk_pages": k, "tokens": n}
        for i, (k, n) in enumerate(zip(summary["topk_pages"], summary["tokens_per_bin"]))
    ]
    print_table(
        rows, title=f"{summary['schedule']} v{summary['version']} (p5 target {summary['target']})"
    )
    for note in summary["notes"]:
        print(f"note: {note}")
    line = (
        f"calibration took {summary['calibration_s']:.1f} s (sampling "
        f"{summary['sample_s']:.1f} s, replaying {len(summary['topk_grid'])} top-k values "
        f"{summary['replay_s']:.1f} s)"
    )
    if "generation_s" in summary:
        line += (
            f"; generating every budget took {summary['generation_s']:.1f} s "
            f"({summary['generation_over_calibration']:.1f}x)"
        )
    print(line)
    print(f"schedule: {summary['yaml']}")
    print(f"plot: {summary['plot']}")
    print(f"train with it: sparrow train schedule.name={summary['schedule']}")
