"""The command's watchdog (sparrow.flows.server_guard): after a kill -9 of the command, a
process started late by one the watchdog had already noted is stopped too, even when its own
parent ended first (the raylet's agents, reparented to init, once outlived a killed run).

Run: `python -m pytest tests/flows/test_server_guard.py -q`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sparrow.flows.server_guard import GRACE_S

_COMMAND = textwrap.dedent(
    """
    import subprocess, sys
    from sparrow.flows.server_guard import guard_local_server
    guard_local_server()
    child = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True
    )
    late = child.stdout.readline().strip()
    child.wait()  # the late process is an orphan now, its parent gone
    print(late, flush=True)
    subprocess.run(["sleep", "120"])
    """
)

# noted at the watchdog's first looks, it starts a process two seconds in and ends later
_CHILD = textwrap.dedent(
    """
    import subprocess, time
    time.sleep(2.0)
    late = subprocess.Popen(["sleep", "120"], stdout=subprocess.DEVNULL, start_new_session=True)
    print(late.pid, flush=True)
    time.sleep(2.5)
    """
)


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard uses /proc and prctl")
def test_kill_9_stops_a_late_grandchild_whose_parent_ended_first():
    command = subprocess.Popen(
        [sys.executable, "-c", _COMMAND, _CHILD], stdout=subprocess.PIPE, text=True
    )
    late = int(command.stdout.readline())
    try:
        assert _running(late)
        command.send_signal(signal.SIGKILL)
        command.wait()
        deadline = time.time() + GRACE_S + 10
        while _running(late) and time.time() < deadline:
            time.sleep(0.2)
        assert not _running(late), f"pid {late} outlived the killed command"
    finally:
        if _running(late):
            os.kill(late, signal.SIGKILL)


_SERVER = textwrap.dedent(
    """
    import json, socket, sys, urllib.request
    from sparrow.flows import server_guard
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    free = server_guard._free_port
    server_guard._free_port = lambda: ports.pop() if ports else free()  # the first one is taken
    spawned = []
    spawn = server_guard.LocalServer._spawn
    def noted(self):
        spawn(self)
        spawned.append(self.process)
    server_guard.LocalServer._spawn = noted
    server = server_guard.start_local_server()
    first = spawned[0]
    with urllib.request.urlopen(server.api_url + "/health") as answer:
        healthy = answer.status
    import prefect.settings
    from prefect.client.orchestration import get_client
    with get_client(sync_client=True) as client:  # Prefect's own client, past the proxy
        client_error = client.api_healthcheck()
    print(json.dumps({
        "respawned": first is not server.process and first.returncode == 3,
        "healthy": healthy,
        "prefect_url": prefect.settings.PREFECT_API_URL.value() == server.api_url,
        "client_error": repr(client_error) if client_error else "",
        "pid": server.process.pid,
    }))
    server.stop()
    print(server.process.poll() is not None)
    """
)


def test_the_server_restarts_on_a_taken_port_answers_and_stops(tmp_path):
    """start_local_server's server (module doc of sparrow.flows.server_guard): a port taken
    before uvicorn binds it means a new one; the server answers, this process's Prefect points
    at it and reaches it although HTTP_PROXY names a proxy that answers nothing (loopback
    requests bypass it), and stop() ends it."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env.update(HTTP_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
    for key in ("NO_PROXY", "no_proxy"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-c", _SERVER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, stopped = done.stdout.strip().splitlines()
    result = json.loads(first)
    assert result["respawned"] and result["healthy"] == 200 and result["prefect_url"], result
    assert result["client_error"] == "", result
    assert stopped == "True" and not _running(result["pid"])
