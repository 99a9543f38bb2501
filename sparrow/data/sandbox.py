"""Run one untrusted Python program inside bubblewrap (bwrap), with hard limits.

    from sparrow.data.sandbox import SandboxLimits, run_in_sandbox
    result = run_in_sandbox(box_dir, ["/sandbox/harness.py", "stdin", "0", "{...}"], SandboxLimits())
    result.returncode, result.stdout, result.timed_out, result.output_exceeded

`box_dir` (a host folder holding the program, the harness and the test inputs) is seen
read-only at /sandbox; /tmp is a private tmpfs, the one writable place; the rest of the view
is /usr (and the /bin, /lib* links or folders), a fresh /proc of the sandbox's own PID
namespace and a minimal /dev. No /etc, no home, no repository. Every namespace is new
(--unshare-all: no network but a loopback nobody listens on), the sandbox cannot make user
namespaces of its own, and it runs in a session of its own. When Sparrow runs as root, bwrap
is started as uid/gid 65534 (nobody): the kernel never applies RLIMIT_NPROC to root, so only
a non-root sandbox has a process limit.

Limits: CPU time, address space, processes, file size and open files are rlimits the harness
sets inside the sandbox before the program runs (per user namespace, so the caller's own
processes do not count against the process limit); stdout and stderr are read here, at most
max_output_bytes each, and the run is killed past that; the wall clock is time_limit_s plus
startup_allowance_s, then the process group is killed. Killing bwrap ends its PID namespace's
init and so every process in it (a double-forked daemon included); --die-with-parent does the
same when the caller dies (the reward runner kills a worker past its deadline). Why bwrap and
not firejail or nsjail: docs/code_rl.md. Tests: tests/data/test_sandbox.py.
"""

from __future__ import annotations

import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sparrow.errors import SparrowError

BWRAP_INSTALL = "apt-get install bubblewrap"
SANDBOX_DIR = "/sandbox"
NOBODY = 65534
STDERR_TAIL_BYTES = 4096
_READ_CHUNK = 1 << 16
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxUnavailableError(SparrowError, RuntimeError):
    """bubblewrap is missing or cannot start a sandbox here; the code reward refuses to run."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (one test of one program)."""

    # CPU seconds (RLIMIT_CPU, rounded up) and wall-clock seconds the program may take
    time_limit_s: float = 2.0
    # extra wall-clock seconds for starting bwrap and the interpreter
    startup_allowance_s: float = 1.0
    # address space (RLIMIT_AS) in bytes
    memory_bytes: int = 512 << 20
    # processes and threads of the sandbox's user (RLIMIT_NPROC), the interpreter included
    max_processes: int = 32
    # bytes read from stdout, and from stderr, before the run is killed
    max_output_bytes: int = 1 << 20
    # largest file the program may write (RLIMIT_FSIZE)
    max_file_bytes: int = 16 << 20
    # size of the private /tmp
    tmpfs_bytes: int = 64 << 20
    # open file descriptors (RLIMIT_NOFILE)
    max_open_files: int = 64

    def __post_init__(self) -> None:
        if not (self.time_limit_s > 0 and self.startup_allowance_s >= 0):
            raise ValueError(
                f"SandboxLimits: time_limit_s must be > 0 and startup_allowance_s "
                f">= 0, got {self.time_limit_s}, {self.startup_allowance_s}"
            )
        for name in (
            "memory_bytes",
            "max_processes",
            "max_output_bytes",
            "max_file_bytes",
            "tmpfs_bytes",
            "max_open_files",
        ):
            if not getattr(self, name) >= 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")

    def rlimits(self) -> dict[str, int]:
        """What the harness sets inside the sandbox (resource module names without RLIMIT_)."""
        return {
            "CPU": math.ceil(self.time_limit_s),
            "AS": self.memory_bytes,
            "NPROC": self.max_processes,
            "FSIZE": self.max_file_bytes,
            "NOFILE": self.max_open_files,
            "CORE": 0,
        }


@dataclass(frozen=True)
class RunResult:
    """How one sandboxed run ended. returncode is None when it was killed from here."""

    returncode: int | None
    stdout: bytes
    stderr_tail: bytes
    timed_out: bool
    output_exceeded: bool
    wall_s: float

    @property
    def finished(self) -> bool:
        """It exited with status 0 on its own, within every limit."""
        return self.returncode == 0 and not self.timed_out and not self.output_exceeded


def find_bwrap() -> str:
    """The bwrap executable; SandboxUnavailableError saying how to install it if missing."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            "the code reward runs generated programs only inside a bubblewrap sandbox, and "
            f"`bwrap` is not on PATH; install it with `{BWRAP_INSTALL}` (Debian/Ubuntu; "
            "`sudo` where not root), or `dnf install bubblewrap` on Fedora"
        )
    return path


def sandbox_python() -> str:
    """The interpreter run inside: the system's /usr/bin/python3, else this one's real file."""
    system = Path("/usr/bin/python3")
    if system.exists():
        return str(system)
    return os.path.realpath(sys.executable)


def bwrap_command(python: str, box_dir: str | Path, limits: SandboxLimits) -> list[str]:
    """bwrap's arguments up to (and including) the interpreter; the caller appends its args."""
    args = [
        find_bwrap(),
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for path in _ROOT_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]  # an interpreter installed outside /usr
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--ro-bind",
        str(box_dir),
        SANDBOX_DIR,
        "--size",
        str(limits.tmpfs_bytes),
        "--tmpfs",
        "/tmp",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        python,
        "-I",
        "-B",
    ]
    return args


def run_in_sandbox(
    box_dir: str | Path, python_args: list[str], limits: SandboxLimits, python: str | None = None
) -> RunResult:
    """Run `python -I -B *python_args` in a fresh sandbox over box_dir; see the module doc."""
    command = bwrap_command(python or sandbox_python(), box_dir, limits) + list(python_args)
    return run_limited(command, limits, drop_root=True)


def run_limited(command: list[str], limits: SandboxLimits, drop_root: bool = False) -> RunResult:
    """Run `command` with its output capped and its wall clock limited, killing its process
    group at either limit. drop_root: as root, start it as nobody (see the module doc)."""
    user = (
        dict(user=NOBODY, group=NOBODY, extra_groups=[]) if drop_root and os.geteuid() == 0 else {}
    )
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **user,
    )
    deadline = start + limits.time_limit_s + limits.startup_allowance_s
    try:
        stdout, stderr, timed_out, exceeded = _read(process, deadline, limits.max_output_bytes)
        if not (timed_out or exceeded):
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        killed = process.poll() is None
        if killed:
            _kill_group(process)
        process.stdout.close()
        process.stderr.close()
    return RunResult(
        returncode=None if killed else process.returncode,
        stdout=bytes(stdout),
        stderr_tail=bytes(stderr[-STDERR_TAIL_BYTES:]),
        timed_out=timed_out,
        output_exceeded=exceeded,
        wall_s=time.monotonic() - start,
    )


def _read(process: subprocess.Popen, deadline: float, max_bytes: int):
    """Read stdout and stderr until both close, the deadline passes or one exceeds max_bytes."""
    buffers = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (
                    buffers[process.stdout.fileno()],
                    buffers[process.stderr.fileno()],
                    True,
                    False,
                )
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffers[key.fd] += chunk
                if len(buffers[key.fd]) > max_bytes:
                    del buffers[key.fd][max_bytes:]
                    return (
                        buffers[process.stdout.fileno()],
                        buffers[process.stderr.fileno()],
                        False,
                        True,
                    )
    return buffers[process.stdout.fileno()], buffers[process.stderr.fileno()], False, False


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the run's process group; bwrap's death ends its PID namespace and all in it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
