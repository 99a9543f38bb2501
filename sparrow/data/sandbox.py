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

Limits, per run: a cgroup of its own (sandbox_cgroup.py, where the machine allows) holds the
total memory of all its processes and its /tmp (total_memory_bytes) and the number of its
processes (max_processes + bwrap's two); after the run whatever is left in it is killed and
checked gone. Per process, the harness sets rlimits inside the sandbox before the program
runs: CPU time, address space, processes (RLIMIT_NPROC, per user namespace), file size and
open files. `total_limits` says what happens where no cgroup can be made: "auto" (the
default) runs with the rlimits alone and warns once, "cgroup" refuses to run, "rlimits"
never tries (docs/code_rl.md says what the weaker mode leaves open). bwrap starts with an
empty environment (sandbox_process.py: its own process is the namespace's init, whose
environ and memory the program can read); stdout and stderr are read here, at most
max_output_bytes each; the wall clock is time_limit_s plus startup_allowance_s, then the
process group (bwrap and its init) is SIGKILLed, which ends the PID namespace and every
process in it; --die-with-parent does the same when the caller dies. /dev is read-only (no
/dev/shm), so /tmp is the one writable place. Why bwrap and not firejail or nsjail:
docs/code_rl.md. Tests: tests/data/test_sandbox.py, tests/data/test_sandbox_limits.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from sparrow.data.sandbox_cgroup import CgroupUnavailable, RunCgroup, find_places
from sparrow.data.sandbox_process import RunResult, run_limited
from sparrow.errors import SparrowError, SparrowWarning

BWRAP_INSTALL = "apt-get install bubblewrap"
SANDBOX_DIR = "/sandbox"
NOBODY = 65534
TOTAL_LIMITS = ("auto", "cgroup", "rlimits")
# bwrap's own two processes in the run's cgroup: the outer one and the namespace's init
BWRAP_PROCESSES = 2
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxUnavailableError(SparrowError, RuntimeError):
    """bubblewrap is missing or cannot start a sandbox here; the code reward refuses to run."""


class WeakerSandboxWarning(SparrowWarning):
    """No cgroup here: the sandbox's memory and process limits hold per process only."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (one test of one program)."""

    # CPU seconds (RLIMIT_CPU, rounded up) and wall-clock seconds the program may take
    time_limit_s: float = 2.0
    # extra wall-clock seconds for starting bwrap and the interpreter
    startup_allowance_s: float = 1.0
    # address space of each process (RLIMIT_AS) in bytes
    memory_bytes: int = 512 << 20
    # memory of all the run's processes together, its /tmp included (the cgroup's limit)
    total_memory_bytes: int = 1 << 30
    # processes and threads of the run, the interpreter included (RLIMIT_NPROC and the cgroup)
    max_processes: int = 32
    # bytes read from stdout, and from stderr, before the run is killed
    max_output_bytes: int = 1 << 20
    # largest file the program may write (RLIMIT_FSIZE)
    max_file_bytes: int = 16 << 20
    # size of the private /tmp
    tmpfs_bytes: int = 64 << 20
    # open file descriptors (RLIMIT_NOFILE)
    max_open_files: int = 64
    # where no cgroup can be made: "auto" runs with per-process limits and warns, "cgroup"
    # refuses to run, "rlimits" never makes one (docs/code_rl.md)
    total_limits: str = "auto"
    # a cgroup v2 folder with memory and pids delegated to make run groups in; "" finds one
    cgroup_parent: str = ""

    def __post_init__(self) -> None:
        if not (self.time_limit_s > 0 and self.startup_allowance_s >= 0):
            raise ValueError(
                f"SandboxLimits: time_limit_s must be > 0 and startup_allowance_s "
                f">= 0, got {self.time_limit_s}, {self.startup_allowance_s}"
            )
        for name in (
            "memory_bytes",
            "total_memory_bytes",
            "max_processes",
            "max_output_bytes",
            "max_file_bytes",
            "tmpfs_bytes",
            "max_open_files",
        ):
            if not getattr(self, name) >= 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.total_limits not in TOTAL_LIMITS:
            raise ValueError(
                f"SandboxLimits.total_limits must be one of {TOTAL_LIMITS}, got {self.total_limits!r}"
            )

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


def bwrap_command(
    python: str, box_dir: str | Path, limits: SandboxLimits, info_fd: int | None = None
) -> list[str]:
    """bwrap's arguments up to (and including) the interpreter; the caller appends its args.
    info_fd: where bwrap writes its init's pid (sandbox_process.py)."""
    args = [find_bwrap()] + (["--info-fd", str(info_fd)] if info_fd is not None else [])
    args += [
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
        "--remount-ro",
        "/dev",  # its tmpfs (and /dev/shm in it) would be writable space of no size limit
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
    wall_s = limits.time_limit_s + limits.startup_allowance_s
    info_pipe = os.pipe()
    try:
        command = bwrap_command(python or sandbox_python(), box_dir, limits, info_pipe[1])
        command += list(python_args)
        drop_root = drop_root_command()
        group = run_cgroup(limits)
    except BaseException:
        os.close(info_pipe[0])
        os.close(info_pipe[1])
        raise
    if group is None:
        return run_limited(command, wall_s, limits.max_output_bytes, True, info_pipe)
    try:
        prefix = group.join_command() + ["--"] + drop_root
        with group.watch_memory():
            result = run_limited(
                prefix + command, wall_s, limits.max_output_bytes, False, info_pipe
            )
        exceeded = group.memory_exceeded()
    finally:
        group.finish()
    return dataclasses.replace(
        result, memory_exceeded=exceeded, total_limits=f"cgroup v{group.version}"
    )


def run_cgroup(limits: SandboxLimits) -> RunCgroup | None:
    """A cgroup for one run, or None where total_limits lets the run go without one."""
    if limits.total_limits == "rlimits":
        return None
    try:
        return RunCgroup.create(
            limits.total_memory_bytes, limits.max_processes + BWRAP_PROCESSES, limits.cgroup_parent
        )
    except CgroupUnavailable as err:
        if limits.total_limits == "cgroup":
            raise _no_cgroup(err) from None
        warnings.warn(
            f"the code sandbox runs without a cgroup ({err}): memory and processes are limited "
            "per process only (docs/code_rl.md); set total_limits='cgroup' to refuse instead",
            WeakerSandboxWarning,
            stacklevel=2,
        )
        return None


def check_sandbox(limits: SandboxLimits) -> None:
    """What the code reward's preflight runs: bwrap is here, and a cgroup where one is required."""
    find_bwrap()
    if limits.total_limits == "cgroup":
        try:
            find_places(limits.cgroup_parent)
        except CgroupUnavailable as err:
            raise _no_cgroup(err) from None


def drop_root_command() -> list[str]:
    """As root, util-linux's setpriv starts bwrap as nobody (RLIMIT_NPROC never binds root);
    it comes after the cgroup join, which needs root's rights."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if setpriv is None:
        raise SandboxUnavailableError(
            "setpriv (util-linux) is not installed: `apt-get install util-linux`"
        )
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


def _no_cgroup(err: CgroupUnavailable) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"SandboxLimits.total_limits='cgroup' and no cgroup can be made here ({err}); give a "
        "delegated cgroup v2 folder as cgroup_parent, or total_limits='auto' for per-process "
        "limits only (docs/code_rl.md)"
    )
