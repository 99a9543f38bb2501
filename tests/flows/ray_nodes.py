"""Two Ray nodes on one machine for a test: `ray start --head` and a second `ray start
--address` at the head, each with its own temp dir, 2 CPUs and a custom resource naming it.

    nodes = RayNodes(tmp_path / "ray")
    nodes.start()                  # ~25 s on a busy 2-core machine
    nodes.address                  # "127.0.0.1:PORT", the head's GCS (ray.address=...)
    nodes.node_of(pid)             # "head", "second" or "" (whose raylet started the process)
    nodes.stop(); nodes.running()  # [] when nothing of either node is left

`ray stop` stops every Ray on the machine (other users' too), so stop() ends only these nodes'
processes: those whose command line names a node's temp dir (GCS, raylet, monitors,
dashboard), and every process the raylets and GCS started (workers and agents, whose titles
Ray rewrites to `ray::...` and so never name the temp dir), noted before anything is killed.
SIGTERM, then SIGKILL to what is left after a grace period. Token authentication is off
(RAY_AUTH_MODE=disabled): the second node and the driver would need the head's token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

NODES = ("head", "second")
CPUS_PER_NODE = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict[str, str]:
    """This process's environment for `ray start` and a driver: no auth token, no usage stats."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    return env


class RayNodes:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.seen: set[int] = set()  # every process of either node noted so far

    def temp_dir(self, node: str) -> Path:
        return self.root / node

    def start(self) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        for node in NODES:
            where = ["--head", f"--port={self.port}", "--include-dashboard=false"]
            if node != "head":
                where = [f"--address={self.address}"]
            done = subprocess.run(
                [
                    ray,
                    "start",
                    *where,
                    f"--num-cpus={CPUS_PER_NODE}",
                    f"--resources={json.dumps({f'{node}_node': 1})}",
                    f"--temp-dir={self.temp_dir(node)}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    "--disable-usage-stats",
                ],
                env=ray_env(),
                capture_output=True,
                text=True,
                timeout=180,
            )
            self.note()
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def _named(self) -> list[psutil.Process]:
        """Processes whose command line names a node's temp dir."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info["cmdline"] or ())
            if str(self.root) in line:
                found.append(proc)
        return found

    def raylet(self, node: str) -> psutil.Process | None:
        for proc in self._named():
            cmdline = proc.info["cmdline"]
            if cmdline[0].endswith("raylet") and str(self.temp_dir(node)) in " ".join(cmdline):
                return proc
        return None

    def node_of(self, pid: int) -> str:
        """The node whose raylet started process `pid` ("" if neither, or it is gone)."""
        raylets = {node: self.raylet(node) for node in NODES}
        try:
            parents = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.NoSuchProcess:
            return ""
        return next((n for n, r in raylets.items() if r is not None and r.pid in parents), "")

    def note(self) -> set[int]:
        """Note the nodes' processes and all their descendants now."""
        for proc in self._named():
            self.seen.add(proc.pid)
            try:
                self.seen.update(child.pid for child in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return self.seen

    def running(self, pids: set[int] | None = None) -> list[str]:
        """Every process of `pids` (default: every noted or named one) still alive, zombies
        aside, as 'pid name'."""
        alive = []
        for pid in self.note() if pids is None else pids:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {proc.name()}")
            except psutil.NoSuchProcess:
                pass
        return alive

    def stop(self, grace_s: float = 10.0) -> None:
        procs = []
        for pid in self.note():
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, left = psutil.wait_procs(procs, timeout=grace_s)
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
        deadline = time.monotonic() + 5
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)
