"""Start one command with an empty environment, read its output up to a cap, end it at a deadline.

    from sparrow.data.sandbox_process import RunResult, run_limited
    result = run_limited(["/usr/bin/bwrap", ...], wall_s=3.0, max_output_bytes=1 << 20)

What sandbox.py runs bwrap with. The command starts with no environment variables at all:
bwrap's own process becomes the sandbox's PID-namespace init, and a program inside can read
that process's /proc/1/environ and memory, so the caller's variables (tokens, keys) must never
reach it. stdout and stderr are read here, at most max_output_bytes each; past that or past
wall_s the command's process group is SIGKILLed (bwrap's init is in it, so the namespace and
every process in it go too). With `--info-fd`, bwrap names its init (its host pid): a program
that ptraces the init can make it leave the process group and drop its parent-death signal, so
the init is also pinned here by a pidfd (checked to be bwrap's child), SIGKILLed at the end and
waited for: when it is gone, so is every process of its PID namespace (the kernel empties the
namespace before its init finishes exiting). Tests: tests/data/test_sandbox.py,
tests/data/test_sandbox_limits.py.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from sparrow.errors import SparrowError

NOBODY = 65534
STDERR_TAIL_BYTES = 4096
_READ_CHUNK = 1 << 16
INIT_EXIT_TIMEOUT_S = 5.0


class SandboxEscapeError(SparrowError, RuntimeError):
    """Processes of a finished run could not be killed; the message names them."""


@dataclass(frozen=True)
class RunResult:
    """How one sandboxed run ended. returncode is None when it was killed from here."""

    returncode: int | None
    stdout: bytes
    stderr_tail: bytes
    timed_out: bool
    output_exceeded: bool
    wall_s: float
    # an out-of-memory kill in the run's cgroup (only known where total_limits is a cgroup)
    memory_exceeded: bool = False
    # what held the totals: "cgroup v2", "cgroup v1", or "rlimits" (per process only)
    total_limits: str = "rlimits"

    @property
    def finished(self) -> bool:
        """It exited with status 0 on its own, within every limit."""
        return (
            self.returncode == 0
            and not self.timed_out
            and not self.output_exceeded
            and not self.memory_exceeded
        )


def run_limited(
    command: list[str],
    wall_s: float,
    max_output_bytes: int,
    as_nobody: bool = False,
    info_pipe: tuple[int, int] | None = None,
) -> RunResult:
    """Run `command` (empty environment, stdin /dev/null, a session of its own) with its output
    capped and its wall clock limited. as_nobody: when root, start it as uid/gid 65534.
    info_pipe: (read end, write end) of the pipe named by bwrap's --info-fd; both are closed."""
    user = (
        dict(user=NOBODY, group=NOBODY, extra_groups=[]) if as_nobody and os.geteuid() == 0 else {}
    )
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={},
            cwd="/",  # bwrap passes its working folder on as PWD
            pass_fds=info_pipe[1:] if info_pipe else (),
            **user,
        )
    except BaseException:
        if info_pipe:
            os.close(info_pipe[0])
        raise
    finally:
        if info_pipe:
            os.close(info_pipe[1])
    info_fd = info_pipe[0] if info_pipe else None
    init = None
    try:
        stdout, stderr, timed_out, exceeded = _read(process, start + wall_s, max_output_bytes)
        init = _pin_init(info_fd, process.pid)
        if not (timed_out or exceeded):
            try:
                process.wait(timeout=max(0.0, start + wall_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        killed = process.poll() is None
        if killed:
            _kill_group(process)
        process.stdout.close()
        process.stderr.close()
        if info_fd is not None:
            os.close(info_fd)
        if init is not None:
            _end_init(init)
    return RunResult(
        returncode=None if killed else process.returncode,
        stdout=bytes(stdout),
        stderr_tail=bytes(stderr[-STDERR_TAIL_BYTES:]),
        timed_out=timed_out,
        output_exceeded=exceeded,
        wall_s=time.monotonic() - start,
    )


def _pin_init(info_fd: int | None, bwrap_pid: int) -> int | None:
    """A pidfd on the sandbox's init, named by bwrap's info JSON; None when the init is gone
    already (its pid is trusted only while its parent is still the bwrap we started)."""
    if info_fd is None:
        return None
    os.set_blocking(info_fd, False)
    try:
        info = json.loads(os.read(info_fd, _READ_CHUNK) or b"{}")
    except (BlockingIOError, json.JSONDecodeError):
        return None
    pid = info.get("child-pid")
    try:
        pidfd = os.pidfd_open(pid)
    except (TypeError, OSError):
        return None
    status = _read_text(f"/proc/{pid}/status")
    if f"\nPPid:\t{bwrap_pid}\n" not in status:
        os.close(pidfd)
        return None
    return pidfd


def _end_init(pidfd: int) -> None:
    """SIGKILL the sandbox's init and wait until it is gone, and its namespace with it."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        ready, _, _ = select.select([pidfd], [], [], INIT_EXIT_TIMEOUT_S)
    finally:
        os.close(pidfd)
    if not ready:
        raise SandboxEscapeError(
            f"the sandbox's PID namespace outlived SIGKILL to its init for {INIT_EXIT_TIMEOUT_S} s"
        )


def _read_text(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _read(process: subprocess.Popen, deadline: float, max_bytes: int):
    """Read stdout and stderr until both close, the deadline passes or one exceeds max_bytes."""
    out, err = process.stdout.fileno(), process.stderr.fileno()
    buffers = {out: bytearray(), err: bytearray()}
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return buffers[out], buffers[err], True, False
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffers[key.fd] += chunk
                if len(buffers[key.fd]) > max_bytes:
                    del buffers[key.fd][max_bytes:]
                    return buffers[out], buffers[err], False, True
    return buffers[out], buffers[err], False, False


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the run's process group; bwrap's death ends its PID namespace and all in it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
