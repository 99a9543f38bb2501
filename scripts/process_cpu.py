"""Where a command's CPU goes, by kind of process: runs the command while reading every
process's CPU time from /proc once a second, and writes per kind (sparrow subprocesses, Ray
workers and daemons, Prefect servers, pytest workers, ...) the CPU-seconds and the process
count. Linux only. A process that lives under a second may be missed; a process that was
already running counts only what it spent during the command.

    python scripts/process_cpu.py --out suite_cpu.json -- python -m pytest -q -n 2 --dist worksteal
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

# (kind, any of these in the command line); the first match wins
KINDS = (
    ("sparrow command", ("sparrow.cli.main", "bin/sparrow ")),
    ("Ray worker or actor", ("default_worker.py", "ray::")),
    ("Ray raylet and GCS", ("raylet/raylet", "gcs/gcs_server")),
    ("Ray daemons", ("ray/dashboard", "ray/_private/log_monitor", "ray/autoscaler")),
    ("Prefect server", ("prefect.server", "uvicorn")),
    ("pytest-xdist worker", ("exec(eval(sys.stdin.readline()))",)),
    ("pytest", ("pytest",)),
    ("benchmark script", ("benchmarks/",)),
    ("sandbox", ("bwrap",)),
    ("other Python", ("python",)),
)


def kind_of(command: str) -> str:
    return next((k for k, marks in KINDS if any(m in command for m in marks)), "other")


def _snapshot(tick: int) -> dict[str, tuple[float, str]]:
    """{pid-starttime: (CPU-seconds so far, command line)} of every process readable now."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue  # gone between the listing and the read
        cpu = (int(fields[11]) + int(fields[12])) / tick
        found[f"{pid}-{fields[19]}"] = (cpu, command.decode(errors="replace")[:400])
    return found


def measure(command: list[str], interval_s: float = 1.0) -> dict:
    """Run `command`; its exit status, wall time and CPU-seconds per kind of process."""
    tick = os.sysconf("SC_CLK_TCK")
    before = _snapshot(tick)
    last: dict[str, tuple[float, str]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(interval_s):
            last.update(_snapshot(tick))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    clock = time.monotonic()
    returncode = subprocess.call(command)
    wall = time.monotonic() - clock
    done.set()
    sampler.join()
    last.update(_snapshot(tick))
    me = f"{os.getpid()}-"
    cpu, count = defaultdict(float), defaultdict(int)
    for key, (seconds, line) in last.items():
        if key.startswith(me):
            continue  # this script's own sampling
        spent = seconds - before.get(key, (0.0, ""))[0]
        if spent > 0:
            cpu[kind_of(line)] += spent
            count[kind_of(line)] += 1
    kinds = sorted(cpu, key=lambda k: -cpu[k])
    return {
        "command": command,
        "returncode": returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(cpu.values()), 1),
        "kinds": [{"kind": k, "cpu_s": round(cpu[k], 1), "processes": count[k]} for k in kinds],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    result = measure(command)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())
