"""The services of a `sparrow` command: Prefect's temporary API server in a session of its own,
and a watchdog that takes everything the command started down with it.

    from sparrow.flows.server_guard import guard_local_server, start_local_server
    guard_local_server()      # once, in the process that will run flows (sparrow train / calibrate)
    start_local_server()      # before the first flow

Ctrl-C in a terminal sends SIGINT to the whole foreground process group. Prefect starts its
temporary API server (uvicorn) as a child in that group, so the server died first and the flow
spent minutes in connection retries. start_local_server starts that same server now, in its
own session, so only the flow sees the signal (Ray's processes already block SIGINT). With
PREFECT_API_URL set (a real server) it does nothing.

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
import functools
import os
import subprocess
import sys
import threading
import time

from sparrow.errors import SparrowError

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


def start_local_server() -> str | None:
    """Start Prefect's temporary API server in its own session (module doc); its API URL, or
    None when PREFECT_API_URL names a server. The flows then use it as they would have."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    server = SubprocessASGIServer()  # the one instance Prefect's clients ask for
    if not server.running:
        server._run_uvicorn_command = functools.partial(_uvicorn_in_own_session, server)
        try:
            server.start()
        except RuntimeError as err:  # it never answered: one line, not Prefect's traceback
            server.stop()
            home = get_current_settings().home
            raise SparrowError(
                f"Prefect's temporary API server did not start ({err}); its database is under "
                f"PREFECT_HOME={home}. Set PREFECT_API_URL to use a running server instead"
            ) from None
        _watch_server(server)
    return server.api_url


def _watch_server(server) -> None:
    """End this process with one line when the server it started dies under it (killed, out
    of memory): Prefect's clients would otherwise retry for minutes and print pages of
    connection tracebacks. A stage is recorded only once whole, so the run resumes where it
    stopped, as after a kill -9 (and the watchdog stops what this process started). Not at
    exit: Prefect stops the server then, after this module's own exit hook has run."""
    process, stopping = server.server_process, threading.Event()
    atexit.register(stopping.set)  # registered after Prefect's stop: runs before it

    def watch() -> None:
        while process.poll() is None:
            time.sleep(0.5)
        if stopping.is_set() or server.server_process is not process:
            return  # stopped on purpose, or restarted by Prefect itself
        sys.stderr.write(
            f"sparrow: Prefect's API server (pid {process.pid}) ended with exit code "
            f"{process.returncode} while the command ran; stopping here. Every recorded stage "
            "is kept: run the same command again to resume.\n"
        )
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch, name="prefect-server-watch", daemon=True).start()


def _uvicorn_in_own_session(server) -> subprocess.Popen:
    # Prefect 3.9's SubprocessASGIServer._run_uvicorn_command, plus start_new_session
    import prefect
    from prefect.settings import get_current_settings

    server_env = {
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--app-dir",
            str(prefect.__module_path__.parent),
            "--factory",
            SERVER_MARK,
            "--host",
            "127.0.0.1",
            "--port",
            str(server.port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ],
        env={
            **os.environ,
            **server_env,
            **get_current_settings().to_environment_variables(exclude_unset=True),
        },
        start_new_session=True,
    )
