"""prefect.yaml against a real local Prefect server: `prefect server start` on 127.0.0.1,
`prefect deploy --all`, a process worker, and a train deployment run to completion.

Everything goes through the CLI as a user types it (docs/pipeline.md, Prefect section), in
subprocesses with their own PREFECT_HOME, each in its own process group so that stopping it
leaves no process behind. The train run joins the Ray of this folder's tests
(tests/flows/conftest.py, `ray.address`) rather than start one of its own, as a run on a
cluster does. Run: `python -m pytest tests/flows/test_prefect_server.py -q`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        env=env,
        cwd=REPO,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    """SIGINT to the whole group (the worker ignores a first SIGTERM), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(process.pid):
            process.poll()
            time.sleep(0.5)
        process.poll()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_healthy(api_url: str, server: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as answer:
                if json.loads(answer.read()) is True:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no Prefect server at {api_url}:\n{log.read_text()[-3000:]}")


def prefect(env: dict, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [*PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def server_env(tmp_path, flow_environment):
    """A Prefect server on a free port of 127.0.0.1: (the environment that points at it, the
    address of the shared Ray)."""
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env, ray_address = flow_environment.subprocess_env(tmp_path / "prefect-home")
    env.update(
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        SPARROW_REPO=str(REPO),
        COLUMNS="200",
    )
    port = api_url.rsplit(":", 1)[1].removesuffix("/api")
    log = tmp_path / "server.log"
    server = start([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port], env, log)
    try:
        wait_healthy(api_url, server, log)
        yield env, ray_address
    finally:
        stop(server)
    assert not group_alive(server.pid), "the Prefect server left a process behind"


def test_deploy_all_and_run_both_flows_on_a_local_server(server_env, tmp_path):
    (env, ray_address), workdir = server_env, tmp_path / "work"
    prefect(env, "work-pool", "create", "sparrow", "--type", "process")
    prefect(env, "--no-prompt", "deploy", "--all")
    listed = prefect(env, "deployment", "ls")
    assert "train/sparrow-train" in listed and "calibrate/sparrow-calibrate" in listed, listed

    # the worker asks for scheduled runs every second, not every 10 s (Prefect's default)
    worker = start(
        [*PREFECT, "worker", "start", "--pool", "sparrow", "--type", "process"],
        dict(env, PREFECT_WORKER_QUERY_SECONDS="1"),
        tmp_path / "worker.log",
    )
    try:
        # the smallest run of the embedded default: 1 step of 2 prompts x 2 samples, no report
        overrides = [
            f"pipeline.workdir={workdir}",
            "pipeline.run_id=served",
            "pipeline.steps=1",
            f"ray.address={ray_address}",
            "data.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=24",
            "pipeline.report=false",
        ]
        run = prefect(
            env,
            "deployment",
            "run",
            "train/sparrow-train",
            "-p",
            f"overrides={json.dumps(overrides)}",
            "--watch",
            "--watch-timeout",
            "480",
            timeout=540,
        )
        # and the calibration flow, as small: 1 prompt x 2 samples, two budgets
        calibrate = [
            f"pipeline.workdir={workdir}",
            "calibrate.num_prompts=1",
            "calibrate.repeats=2",
            "calibrate.topk_pages=[2,4]",
            "calibrate.min_bin_tokens=5",
            "calibrate.min_bin_samples=1",
            "calibrate.max_new_tokens=48",
            "calibrate.name=served-cal",
        ]
        calibrated = prefect(
            env,
            "deployment",
            "run",
            "calibrate/sparrow-calibrate",
            "-p",
            f"overrides={json.dumps(calibrate)}",
            "--watch",
            "--watch-timeout",
            "480",
            timeout=540,
        )
    finally:
        stop(worker)
    assert not group_alive(worker.pid), "the worker left a process behind"
    assert "Completed" in run, run + (tmp_path / "worker.log").read_text()[-3000:]
    assert "Completed" in calibrated, calibrated + (tmp_path / "worker.log").read_text()[-3000:]
    rollouts = pq.read_table(workdir / "runs/served/step-1/rollout/rollouts.parquet")
    assert rollouts.num_rows == 2 * 2
