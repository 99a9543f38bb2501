"""Hostile programs against the sandbox's totals and its walls (sparrow/data/sandbox.py): the
caller's environment (its variables, /proc/1/environ, the init's memory), memory held by
several processes together, the size of the writable space, a ptraced init that leaves the
process group, signals to every process it can reach, /proc, sleeping past the timeout, and
what total_limits does where no cgroup can be made. Needs bwrap; the total-memory test needs a
cgroup this process may make folders in (root on this project's machines).
Run: `python -m pytest tests/data/test_sandbox_limits.py -q`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import textwrap
import time
import uuid

import pytest

from sparrow.data.code_reward import program_box, run_test
from sparrow.data.sandbox import SandboxLimits, SandboxUnavailableError, WeakerSandboxWarning
from sparrow.data.sandbox_cgroup import CgroupUnavailable, find_places
from tests.data.test_sandbox import processes_with

LIMITS = SandboxLimits(
    time_limit_s=1.5,
    startup_allowance_s=1.0,
    memory_bytes=256 << 20,
    total_memory_bytes=320 << 20,
    max_processes=16,
    max_output_bytes=64 << 10,
    tmpfs_bytes=32 << 20,
)
SECRET = f"hunter2-{uuid.uuid4().hex}"


def run(program: str, limits: SandboxLimits = LIMITS):
    with program_box(textwrap.dedent(program)) as box:
        return run_test(box, 0, "", limits)


def has_cgroup() -> bool:
    try:
        find_places()
    except CgroupUnavailable:
        return False
    return True


def test_the_callers_environment_cannot_be_read(monkeypatch):
    """Not in the program's variables, nor in any /proc/N/environ it sees, nor anywhere in the
    memory of the namespace's init (bwrap, which the program may ptrace and read)."""
    monkeypatch.setenv("SPARROW_TEST_SECRET", SECRET)
    result = run(f"""
        import os, re
        found = [k for k, v in os.environ.items() if "{SECRET}" in v]
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            for name in ("environ", "cmdline"):
                try:
                    if b"{SECRET}" in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                        found.append(f"/proc/{{pid}}/{{name}}")
                except OSError:
                    pass
        with open("/proc/1/maps") as maps, open("/proc/1/mem", "rb") as mem:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                if line.split()[1].startswith("r"):
                    try:
                        mem.seek(start)
                        if b"{SECRET}" in mem.read(end - start):
                            found.append("init memory " + line.split()[0])
                    except OSError:
                        pass
        print((sorted(os.environ), found))
        """)
    assert result.finished, result
    names, found = eval(result.stdout.decode())
    assert found == [] and set(names) <= {"PATH", "HOME", "LANG", "PYTHONHASHSEED", "PWD"}


@pytest.mark.skipif(not has_cgroup(), reason="no cgroup can be made here (weaker mode)")
def test_several_processes_together_hold_no_more_than_the_total_memory():
    """Six processes of 100 MiB each stay under the 256 MiB per-process limit, but not under
    the 320 MiB total: the run's cgroup kills some (an out-of-memory kill, reported)."""
    result = run("""
        import os, time
        children = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                block = bytearray(100 << 20)
                block[::4096] = b"x" * len(block[::4096])   # touch every page
                print("held", flush=True)
                time.sleep(1.0)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        """)
    held = result.stdout.split().count(b"held")
    assert result.memory_exceeded and not result.finished
    assert result.total_limits.startswith("cgroup")
    assert held * 100 <= 320, held


def test_the_writable_space_holds_no_more_than_its_size():
    """/tmp is a tmpfs of tmpfs_bytes; /dev, /dev/shm and every other folder are read-only."""
    result = run("""
        import os
        written = 0
        for folder in ("/tmp", "/dev", "/dev/shm", "/dev/pts", "/proc", "/", "/sandbox", "/usr"):
            for index in range(10):
                try:
                    with open(f"{folder}/f{index}", "wb") as handle:
                        for _ in range(8):
                            handle.write(b"x" * (1 << 20))
                            handle.flush()
                            written += 1 << 20
                except OSError:
                    break
        print(written >> 20)
        """)
    assert result.finished, result
    assert int(result.stdout) <= LIMITS.tmpfs_bytes >> 20


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the injection below is x86_64 code")
@pytest.mark.parametrize("total_limits", ["auto", "rlimits"])
def test_a_ptraced_init_that_leaves_the_process_group_is_still_killed(total_limits):
    """The program ptraces the namespace's init (bwrap, same uid), makes it call setsid() and
    drop its parent-death signal, and keeps it stopped, so that killing bwrap's process group
    no longer ends the namespace; a daemon then waits in it. Nothing may be left, with the
    run's cgroup or without ("rlimits": the init's pidfd alone)."""
    marker = f"ptraced-{uuid.uuid4().hex}"
    limits = dataclasses.replace(LIMITS, total_limits=total_limits)
    result = run(PTRACE_INIT.replace("MARKER", marker), limits)
    assert b"injected" in result.stdout, result
    time.sleep(0.3)
    assert processes_with(marker) == []


PTRACE_INIT = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
NAMES = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp"
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (NAMES + " ss fs_base gs_base ds es fs gs").split()]
def call(number, first=0, second=0):  # run one system call in init, stopped inside one
    regs = Regs()
    libc.ptrace(12, 1, None, ctypes.byref(regs))
    regs.rip, regs.rax, regs.orig_rax, regs.rdi, regs.rsi = regs.rip - 2, number, 2**64 - 1, first, second
    libc.ptrace(13, 1, None, ctypes.byref(regs))
    libc.ptrace(9, 1, None, None)
    os.waitpid(1, 0x40000000)
    libc.ptrace(12, 1, None, ctypes.byref(regs))
    return regs.rax
if os.fork() == 0:
    assert libc.ptrace(0x4206, 1, None, None) == 0, os.strerror(ctypes.get_errno())
    libc.ptrace(0x4207, 1, None, None)
    os.waitpid(1, 0x40000000)
    print("injected", call(112), call(157, 1, 0), flush=True)  # setsid, prctl(PDEATHSIG, 0)
    os.closerange(0, 3)
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "MARKER"])
time.sleep(0.5)
"""


def test_signals_reach_no_process_outside():
    """kill(-1), kill of the parent and of every pid it can name: the caller and a process of
    the sandbox's own uid outside it live on."""
    outside = subprocess.Popen(["sleep", "30"], user=65534 if os.geteuid() == 0 else None)
    try:
        result = run("""
            import os, signal
            for target in (-1, 0, os.getppid(), 1):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
            """)
        assert outside.poll() is None
        visible = eval(result.stdout.decode() or "[]")
        assert outside.pid not in visible and os.getpid() not in visible
        assert max(visible, default=0) < 10  # only the sandbox's own namespace
    finally:
        outside.kill()
        outside.wait()


def test_sleeping_past_the_timeout_with_a_daemon_leaves_nothing():
    """No CPU is used, so only the wall clock ends it; a setsid daemon goes with it."""
    marker = f"sleeper-{uuid.uuid4().hex}"
    start = time.monotonic()
    result = run(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)",
                                      "{marker}"])
        time.sleep(100)
        """)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < LIMITS.time_limit_s + LIMITS.startup_allowance_s + 2.0
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_total_limits_cgroup_refuses_where_no_cgroup_can_be_made(tmp_path):
    limits = SandboxLimits(total_limits="cgroup", cgroup_parent=str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match="total_limits='cgroup'"):
        run("print(1)", limits)


def test_total_limits_auto_runs_weaker_with_a_warning_and_rlimits_says_so(tmp_path):
    with pytest.warns(WeakerSandboxWarning, match="per process only"):
        result = run("print(1)", SandboxLimits(cgroup_parent=str(tmp_path)))
    assert result.finished and result.total_limits == "rlimits"
    assert run("print(1)", SandboxLimits(total_limits="rlimits")).total_limits == "rlimits"
    with pytest.raises(ValueError, match="total_limits"):
        SandboxLimits(total_limits="none")


@pytest.mark.skipif(not has_cgroup(), reason="no cgroup can be made here (weaker mode)")
def test_run_groups_of_a_caller_that_died_are_removed_and_a_run_leaves_none():
    from sparrow.data import sandbox_cgroup

    dead = subprocess.Popen(["true"])
    dead.wait()
    _, places = find_places()
    stale = [place / f"sparrow-sandbox-{dead.pid}-0-stale" for place in places]
    for folder in stale:
        folder.mkdir()
    sandbox_cgroup._sweep.cache_clear()
    assert run("print(1)").total_limits.startswith("cgroup")
    assert not any(folder.exists() for folder in stale)
    assert not [f for p in places for f in p.glob(f"sparrow-sandbox-{os.getpid()}-*")]
