"""The services of a `sparrow` command: Prefect's temporary API server in a session of its own,
and a watchdog that takes everything the command started down with it.

    from sparrow.flows.server_guard import guard_local_server, start_local_server
    guard_local_server()   # once, in the process that will run flows (sparrow train / calibrate)
    start_local_server()   # before Prefect is imported and the first flow runs

Ctrl-C in a terminal sends SIGINT to the whole foreground process group. Prefect starts its
temporary API server (uvicorn) as a child in that group, so the server died first and the flow
spent minutes in connection retries. start_local_server starts that same server (the same
uvicorn command and settings) itself, in its own session, so only the flow sees the signal
(Ray's processes already block SIGINT), and sets PREFECT_API_URL to it: Prefect's clients then
use it as any server, and Prefect's server code (about 3 s of imports) stays out of this
process. With PREFECT_API_URL already set (a real server) it does nothing. A new PREFECT_HOME
starts from a copy of a database this Prefect version made before (flows/prefect_template.py).

A process killed with SIGKILL cannot stop what it started: the Prefect server runs on, and
Ray's dashboard and runtime-env agents (started by the raylet even without the dashboard)
wait about two minutes for a GCS that is gone before they exit. The watchdog is a small
separate process that the kernel signals when its parent dies (Linux PR_SET_PDEATHSIG):
while the parent lives it notes, once a second, every process descended from it; when the
parent dies it sends each one still running (same pid and start time) SIGTERM, and SIGKILL
after GRACE_S. So nothing outlives a `kill -9` by more than about GRACE_S + 1 s. Off Linux
it does nothing. A Ray cluster joined with ray.address is not the command's and is left alone.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sparrow.errors import SparrowError
from sparrow.flows import prefect_template

SERVER_MARK = "prefect.server.api.server:create_app"
GRACE_S = 3.0

_WATCH = r"""
import ctypes, os, signal, sys, time
parent = int(sys.argv[1]); grace = float(sys.argv[2]); me = os.getpid()
seen = {}
def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
def children(pid):
    # every thread's children: Prefect and Ray start processes from other threads too
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return found
def note(roots):
    # the whole tree at every look: a process noted earlier starts children later (the raylet
    # its agents), and those outlive it when it dies first
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for kid in children(pid):
            if kid != me:
                started = start_time(kid)
                if started is not None:
                    seen[kid] = started
                    todo.append(kid)
def alive():
    return [pid for pid, started in seen.items() if start_time(pid) == started]
def send(sig):
    for pid in alive():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
def stop(*_):
    note(alive())  # what the survivors started since the last look
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    send(signal.SIGKILL)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    stop()
while True:
    note([parent])
    time.sleep(1.0)
"""


_WATCHDOG: dict[int, subprocess.Popen] = {}  # this process's watchdog, by pid (a fork has none)


def guard_local_server() -> subprocess.Popen | None:
    """Start the watchdog (module doc), once per process; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    running = _WATCHDOG.get(os.getpid())
    if running is not None and running.poll() is None:
        return running
    _WATCHDOG[os.getpid()] = subprocess.Popen(
        [sys.executable, "-c", _WATCH, str(os.getpid()), str(GRACE_S)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return _WATCHDOG[os.getpid()]


class LocalServer:
    """Prefect's API server as this command runs it (start_local_server): a uvicorn process of
    its own session on a free port of 127.0.0.1, stopped at exit."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.stopping = threading.Event()
        self._spawn()
        atexit.register(self.stop)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _spawn(self) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(_prefect_parent()),
                "--factory",
                SERVER_MARK,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env={**os.environ, **_SERVER_ENV},
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches the flow alone
        )

    def wait(self) -> None:
        """Return once the server answers its health check (on a new port if uvicorn found its
        port taken); or stop it and raise SparrowError after
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS. Then watch it (_watch_server)."""
        import urllib.error
        import urllib.request

        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 180))
        deadline, restarts = time.monotonic() + timeout, 0
        while True:
            code = self.process.poll()
            if code == _PORT_TAKEN and restarts < 3:  # another process took the port first
                restarts += 1
                self._spawn()
                continue
            if code is not None:
                self._fail(f"its process exited with code {code}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() >= deadline:
                self._fail(f"no answer within {timeout:g} s")
            time.sleep(0.1)
        _watch_server(self.process, self.stopping)

    def _fail(self, why: str) -> None:
        self.stop()
        raise SparrowError(
            f"Prefect's temporary API server did not start ({why}); its database is under "
            f"PREFECT_HOME={_prefect_home()}. Set PREFECT_API_URL to use a running server instead"
        )

    def stop(self) -> None:
        self.stopping.set()
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_local_server() -> LocalServer | None:
    """Start Prefect's temporary API server for this command's flows, in a session of its own
    (module doc), wait for its health check and point this process's Prefect at it
    (PREFECT_API_URL); None when PREFECT_API_URL already names a server. Call before Prefect
    is imported: its settings read the environment once."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    if "prefect" in sys.modules:
        raise RuntimeError("start_local_server() must run before Prefect is imported")
    _no_proxy_for_loopback()
    made = prefect_template.seed_database()  # a new home starts from a made database
    server = LocalServer()
    server.wait()
    if made == "new":  # this server made its database: later new homes copy it
        prefect_template.keep_template()
    os.environ["PREFECT_API_URL"] = server.api_url
    return server


def _no_proxy_for_loopback() -> None:
    """Add 127.0.0.1 and localhost to NO_PROXY (both spellings): the server listens on the
    loopback only, and with HTTP_PROXY set (a proxied network) Prefect's HTTP client would
    send even those requests to the proxy and fail."""
    for key in ("NO_PROXY", "no_proxy"):
        hosts = [h.strip() for h in os.environ.get(key, "").split(",") if h.strip()]
        hosts += [h for h in ("127.0.0.1", "localhost") if h not in hosts]
        os.environ[key] = ",".join(hosts)


# what Prefect's own temporary server is started with (no UI; the server knows it is one)
_SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
_PORT_TAKEN = 3  # uvicorn's exit code when it cannot bind


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prefect_parent() -> Path:
    """The folder holding the prefect package, found without importing it."""
    spec = importlib.util.find_spec("prefect")
    return Path(spec.origin).parent.parent


def _prefect_home() -> str:
    """Where Prefect keeps its database: PREFECT_HOME, ~/.prefect by default."""
    return str(Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser())


def _watch_server(process: subprocess.Popen, stopping: threading.Event) -> None:
    """End this process with one line when the server it started dies under it (killed, out
    of memory): Prefect's clients would otherwise retry for minutes and print pages of
    connection tracebacks. A stage is recorded only once whole, so the run resumes where it
    stopped, as after a kill -9 (and the watchdog stops what this process started). Not once
    the command stops the server itself (stopping set)."""

    def watch() -> None:
        while process.poll() is None:
            time.sleep(0.5)
        if stopping.is_set():
            return
        sys.stderr.write(
            f"sparrow: Prefect's API server (pid {process.pid}) ended with exit code "
            f"{process.returncode} while the command ran; stopping here. Every recorded stage "
            "is kept: run the same command again to resume.\n"
        )
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="prefect-server-watch", daemon=True).start()
