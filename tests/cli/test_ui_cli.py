"""`sparrow ui`: MLflow's UI over a workdir, and nothing of it left once stopped (MLflow's own
`mlflow ui` leaves workers behind after a SIGTERM).

Run: `python -m pytest tests/cli/test_ui_cli.py -q` (slow: MLflow's server takes ~20 s).
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


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ui_serves_and_leaves_nothing_once_stopped(tmp_path, stop):
    port = _free_port()
    # started as a shell starts a foreground job: Python's own SIGINT handler, whatever this test
    # process inherited (a process started with SIGINT ignored keeps ignoring it, Ctrl-C too)
    foreground = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('sparrow.cli.main', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", foreground, "ui", "--workdir", str(tmp_path)]
        + ["--port", str(port)],
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
        assert len(_session(mlflow)) >= 3  # uvicorn's workers, the job runner, ...
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
