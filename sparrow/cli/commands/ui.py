"""`sparrow ui [--workdir DIR] [--port N]`: MLflow's UI over a workdir's runs, stopped cleanly.

    sparrow ui                                  # ./sparrow-work/mlflow.db at http://127.0.0.1:5000
    sparrow ui --workdir /runs/q17 --port 5001
    sparrow ui --backend-store-uri postgresql://...   # the run's pipeline.mlflow_uri, if set

Why not `mlflow ui` itself: MLflow 3.17's server is a uvicorn with 4 workers, a job runner
and its huey consumers, and a SIGTERM to its main process leaves about 10 of them running (a
SIGTERM to the whole group still leaves one): MLflow's own behaviour. This command starts
`mlflow ui` in a process group of its own and, on Ctrl-C or SIGTERM, signals the whole group,
waits GRACE_S and then kills whatever is left; a kill -9 of this command is covered by the
same watchdog as `sparrow train` (sparrow/flows/server_guard.py).
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
    parser.set_defaults(func=run)


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

    uri = args.backend_store_uri or f"sqlite:///{Path(args.workdir).resolve()}/mlflow.db"
    guard_local_server()  # a kill -9 of this command takes MLflow's processes with it
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
        + ["--host", args.host, "--port", str(args.port)],
        start_new_session=True,
    )
    print(f"MLflow UI: http://{args.host}:{args.port} ({uri}); Ctrl-C stops it", flush=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(proc)
