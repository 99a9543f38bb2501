"""A watchdog that takes Prefect's temporary API server down with the process that started it.

    from sparrow.flows.server_guard import guard_local_server
    guard_local_server()      # once, in the process that will run flows (sparrow train / calibrate)

Without a Prefect server, Prefect starts a temporary API server (uvicorn) as a child of the
flow's process and stops it when the process exits normally. A process killed with SIGKILL
cannot stop it: the server is reparented to init and runs on. The guard is a small separate
process that the kernel signals when its parent dies (Linux PR_SET_PDEATHSIG): while the
parent lives it notes, once a second, the parent's child processes that are Prefect API
servers; when the parent dies it terminates them. Off Linux, or with PREFECT_API_URL set (a
real server, not ours to stop), it does nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

SERVER_MARK = "prefect.server.api.server:create_app"

_WATCH = r"""
import ctypes, os, signal, sys, time
parent = int(sys.argv[1]); mark = sys.argv[2]
seen = set()
def children(pid):
    # every thread's children: Prefect may start its server from a thread other than main
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
def is_server(pid):
    if pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return mark.encode() in f.read()
    except OSError:
        return False
def stop(*_):
    for pid in seen:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    stop()
while True:
    seen.update(p for p in children(parent) if is_server(p))
    time.sleep(1.0)
"""


_WATCHDOG: dict[int, subprocess.Popen] = {}  # this process's watchdog, by pid (a fork has none)


def guard_local_server() -> subprocess.Popen | None:
    """Start the watchdog (module doc), once per process; None where it does not apply."""
    if not sys.platform.startswith("linux") or os.environ.get("PREFECT_API_URL"):
        return None
    running = _WATCHDOG.get(os.getpid())
    if running is not None and running.poll() is None:
        return running
    _WATCHDOG[os.getpid()] = subprocess.Popen(
        [sys.executable, "-c", _WATCH, str(os.getpid()), SERVER_MARK],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return _WATCHDOG[os.getpid()]
