"""`sparrow ui [--workdir DIR] [--port N]`: MLflow's UI over a workdir's runs, stopped cleanly.

    sparrow ui                                  # ./sparrow-work/mlflow.db at http://127.0.0.1:5000
    sparrow ui --workdir /runs/q17 --port 5001
    sparrow ui --backend-store-uri postgresql://...   # the run's pipeline.mlflow_uri, if set
    sparrow ui --workers 4                      # MLflow's own default, for many viewers

Why not `mlflow ui` itself: MLflow 3.17's server is a uvicorn with 4 workers, a job runner
and its huey consumers, and a SIGTERM to its main process leaves about 10 of them running (a
SIGTERM to the whole group still leaves one): MLflow's own behaviour. This command starts
`mlflow ui` in a process group of its own and, on Ctrl-C or SIGTERM, signals the whole group,
waits GRACE_S and then kills whatever is left; a kill -9 of this command is covered by the
same watchdog as `sparrow train` (sparrow/flows/server_guard.py).

A viewer for one person by default: one uvicorn worker, and MLflow's job execution off (its
job runner and seven huey consumers serve MLflow's GenAI jobs, which Sparrow's runs never
submit). Two processes instead of 15, listening in about half the time at a quarter of the
CPU (2 cores: 8 s and 8.5 CPU-s against 17 s and 35 CPU-s). `--workers` and a
MLFLOW_SERVER_ENABLE_JOB_EXECUTION set in the environment are passed through as given.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparrow.config.schema import PipelineConfig

GRACE_S = 5.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ui", help="MLflow's UI over a workdir's runs (stops cleanly)")
    parser.add_argument("--workdir", default=PipelineConfig.workdir, help="the runs' workdir")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--backend-store-uri", default="", help="default: sqlite:///<workdir>/mlflow.db"
    )
    parser.add_argument(
        "--workers", type=_positive, default=1, help="uvicorn workers (MLflow's own default: 4)"
    )
    parser.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text) if text.strip().isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number >= 1 is needed, got {text!r}")
    return value


def backend_uri(args: argparse.Namespace) -> str:
    return args.backend_store_uri or f"sqlite:///{Path(args.workdir).resolve()}/mlflow.db"


def mlflow_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The `mlflow ui` command line and its environment for these arguments."""
    uri = backend_uri(args)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    command += ["--host", args.host, "--port", str(args.port), "--workers", str(args.workers)]
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # a user's setting stands
    return command, env


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the process group led by `proc`, SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a member
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from sparrow.flows.server_guard import guard_local_server

    command, env = mlflow_command(args)
    uri = backend_uri(args)
    guard_local_server()  # a kill -9 of this command takes MLflow's processes with it
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    print(f"MLflow UI: http://{args.host}:{args.port} ({uri}); Ctrl-C stops it", flush=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(proc)
