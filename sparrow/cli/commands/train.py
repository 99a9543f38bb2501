"""`sparrow train [key=value ...]`: run, or resume, RL training (the Prefect train flow).

    sparrow train                                        # the embedded default, CPU, a few minutes
    sparrow train pipeline.steps=2 data.prompts_per_step=2 rollout.samples_per_prompt=2
    sparrow train pipeline.run_id=r1 pipeline.fail_at=policy_update@2   # fails there on purpose
    sparrow train pipeline.run_id=r1                     # resumes r1 at its first missing stage
    sparrow train model.path=/models/Qwen3-1.7B data.train=/data/train.parquet --json

Prints one table row per step (reward, length, min p5, pages read, tokens/s, stage times) and
at the end where to look (DuckDB file, `sparrow query`, `mlflow ui`). --json prints the run
summary instead. The configuration and the model path are checked before Prefect and Ray
start, so a bad key or a missing model directory is one error line at once. No Prefect
server is needed (sparrow/flows/prefect_env.py); docs/pipeline.md describes the flow.
"""

from __future__ import annotations

import argparse

from sparrow.cli.output import print_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="run or resume RL training (the train flow)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. pipeline.steps=2 (sparrow config show)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the run summary as JSON instead of the per-step table",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow.flows.prefect_env import quiet_prefect

    quiet_prefect()
    from sparrow.config import load_config
    from sparrow.flows.server_guard import guard_local_server, start_local_server
    from sparrow.flows.train_setup import check_steps
    from sparrow.model.builtin import resolve_model_path

    cfg = load_config(args.overrides)
    check_steps(cfg)
    resolve_model_path(cfg.model.path)
    # a kill -9 of this process must not leave Prefect's server or Ray's agents behind
    guard_local_server()
    from sparrow.runtime.interrupt import install_sigint

    install_sigint()
    if not args.json:  # services take 30 s to 1.5 min on a busy machine: say so at once
        print("starting services (Prefect API, Ray, rollout actors) ...", flush=True)
    # Prefect's API server, in a session of its own: Ctrl-C from a terminal reaches the whole
    # process group
    start_local_server()

    from sparrow.flows.train import train_flow

    summary = train_flow(list(args.overrides), show_table=not args.json)
    if args.json:
        print_json(summary)
    return 0
