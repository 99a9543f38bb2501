"""`sparrow ui`: MLflow's UI over a workdir, and nothing of it left once stopped (MLflow's own
`mlflow ui` leaves workers behind after a SIGTERM); by default a lean server (one worker, no
job runner), MLflow's full layout when asked.

Run: `python -m pytest tests/cli/test_ui_cli.py -q` (slow: MLflow's server takes 8-20 s).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session(sid: int) -> list[int]:
    """The processes of session `sid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat, the session id
            found.append(int(stat.parent.name))
    return found


def _args(*argv: str):
    import argparse

    from sparrow.cli.commands import ui

    parser = argparse.ArgumentParser()
    ui.add_parser(parser.add_subparsers())
    return parser.parse_args(["ui", *argv])


def test_the_default_server_is_one_worker_without_mlflows_job_runner(tmp_path, monkeypatch):
    from sparrow.cli.commands.ui import mlflow_command

    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    command, env = mlflow_command(_args("--workdir", str(tmp_path), "--port", "5123"))
    assert command[command.index("--workers") + 1] == "1"
    assert command[command.index("--port") + 1] == "5123"
    assert command[command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path}/mlflow.db"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    # what the user asked for stands: MLflow's own layout
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    command, env = mlflow_command(_args("--workers", "4"))
    assert command[command.index("--workers") + 1] == "4"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"


@pytest.mark.parametrize("workers", ["0", "-2", "two", ""])
def test_workers_below_one_is_one_error_naming_the_option(workers, capsys):
    with pytest.raises(SystemExit) as exit:
        _args("--workers", workers)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "--workers" in err and f"got {workers!r}" in err


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "stop, full",
    [("ctrl-c", False), ("sigterm", True)],
    ids=["ctrl-c-lean", "sigterm-mlflows-full-layout"],
)
def test_ui_serves_and_leaves_nothing_once_stopped(tmp_path, stop, full):
    """The lean default (2 processes) and MLflow's own layout (4 workers and its job runner:
    the ~15 processes a SIGTERM to `mlflow ui` alone leaves behind)."""
    port = _free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="true" if full else "false")
    # started as a shell starts a foreground job: Python's own SIGINT handler, whatever this test
    # process inherited (a process started with SIGINT ignored keeps ignoring it, Ctrl-C too)
    foreground = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('sparrow.cli.main', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", foreground, "ui", "--workdir", str(tmp_path)]
        + ["--port", str(port)]
        + (["--workers", "4"] if full else []),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("MLflow's UI never listened")
        [mlflow] = _mlflow_session(proc.pid)
        # lean: `mlflow ui` and its uvicorn; full: 4 workers, the job runner, its consumers
        # (which may still be starting when the port listens on a loaded machine)
        want = 10 if full else 2
        settled = time.time() + 60
        while len(_session(mlflow)) < want and time.time() < settled:
            time.sleep(0.5)
        assert len(_session(mlflow)) >= want, _where(proc.pid, mlflow)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends
        else:
            proc.send_signal(signal.SIGTERM)
        # MLflow writes to the same pipe: drained while waiting, so a full pipe cannot stall it
        out = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=60)  # grace 5 s + kill; room for a loaded machine
        except subprocess.TimeoutExpired:
            pytest.fail(f"`sparrow ui` still running 60 s after {stop}: {_where(proc.pid, mlflow)}")
        assert code == 0
        reader.join(timeout=10)
        assert _session(mlflow) == []
        assert "Ctrl-C stops it" in "".join(out)
    finally:
        if proc.poll() is None:  # a failed check must not leave the server running
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def _where(pid: int, mlflow_sid: int) -> str:
    """What a process that does not stop is doing: its state and kernel wait channel, and
    those of the MLflow session's processes still there (a failure's message)."""

    def one(p: int) -> str:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{p}/wchan").read_text()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode()
        except OSError:
            return f"{p}: gone"
        return f"{p} {state} {wchan} {cmd}"

    return "; ".join(one(p) for p in [pid, *_session(mlflow_sid)])


def _mlflow_session(pid: int) -> list[int]:
    """The session of `pid`'s child that runs `mlflow ui` (it leads a session of its own)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [os.getsid(k) for k in kids if b"mlflow\0ui" in Path(f"/proc/{k}/cmdline").read_bytes()]
