"""Hostile programs stay inside the bwrap sandbox (sparrow/data/sandbox.py): one test
each for a fork bomb, rm -rf of the home and the repository, writing outside /tmp, sockets,
reading /etc/passwd and the repository, 10 GB of memory, 1 GB of output, an infinite loop, a
daemon that would outlive the run, and the caller dying mid-run. Needs bwrap (the README's
test command installs it). Run: `python -m pytest tests/data/test_sandbox.py -q`.
"""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sparrow.data.code_reward import program_box, run_test
from sparrow.data.sandbox import SandboxLimits

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(
    time_limit_s=1.0,
    startup_allowance_s=1.0,
    memory_bytes=256 << 20,
    max_processes=16,
    max_output_bytes=64 << 10,
)


def run(program: str, stdin: str = "", limits: SandboxLimits = LIMITS):
    with program_box(textwrap.dedent(program)) as box:
        return run_test(box, 0, stdin, limits)


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under folder: (mode, content hash), by relative path."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mode, hashlib.sha1(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def canary(tmp_path):
    """A folder of files the sandbox must not touch, world-writable so that only the sandbox
    (not file permissions) keeps a program running as nobody away from it."""
    folder = tmp_path / "canary"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("canary\n")
    (folder / "sub" / "deep.txt").write_text("deep\n")
    for path in (
        tmp_path,
        folder,
        folder / "sub",
        folder / "keep.txt",
        folder / "sub" / "deep.txt",
    ):
        path.chmod(0o777 if path.is_dir() else 0o666)
    return folder


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_fork_bomb_is_stopped_by_the_process_limit_and_leaves_nothing_behind():
    marker = f"forkbomb-{uuid.uuid4().hex}"
    result = run(f"""
        import os, sys, time
        children = 0
        for _ in range(10000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)",
                                          "{marker}"])
            children += 1
        print(children, flush=True)
        while True:  # keep forking: the wall clock must end it
            try:
                os.fork()
            except OSError:
                pass
        """)
    assert result.timed_out or result.returncode != 0
    assert 0 < int(result.stdout.split()[0]) < LIMITS.max_processes
    assert result.wall_s < 5.0
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_rm_rf_of_home_and_repo_touches_nothing_outside(canary):
    before, repo_before = snapshot(canary), snapshot(REPO / "sparrow" / "data")
    result = run(f"""
        import os, shutil, subprocess
        for path in ("/root", os.path.expanduser("~"), "/home", {str(REPO)!r}, {str(canary)!r},
                     {str(canary.parent)!r}, "/work", "/sandbox", "/tmp"):
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["rm", "-rf", path], stderr=subprocess.DEVNULL)
        try:  # (rm -rf of /usr itself takes over 10 s to walk; one file shows it is read-only)
            os.remove("/usr/bin/env")
        except OSError as err:
            print(type(err).__name__)
        print("done")
        """)
    assert result.stdout.split() == [b"OSError", b"done"]
    assert snapshot(canary) == before
    assert snapshot(REPO / "sparrow" / "data") == repo_before


def test_writes_outside_the_private_tmp_fail_and_tmp_is_private(canary):
    name = f"sparrow-sandbox-{uuid.uuid4().hex}"
    before = snapshot(canary)
    result = run(f"""
        for path in ({str(canary / "new.txt")!r}, {str(canary / "keep.txt")!r}, "/sandbox/x",
                     "/usr/x", "/x", "/proc/x", {str(REPO / name)!r}, "/tmp/{name}"):
            try:
                with open(path, "w") as handle:
                    handle.write("owned")
                print("wrote", path)
            except OSError as err:
                print("refused", path, type(err).__name__)
        """)
    lines = result.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines] == ["refused"] * 7 + ["wrote"], lines
    assert snapshot(canary) == before
    assert not Path("/tmp", name).exists() and not (REPO / name).exists()


def test_sockets_reach_neither_the_host_loopback_nor_the_outside():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        result = run(f"""
            import socket
            for address in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
                try:
                    socket.create_connection(address, timeout=0.5).close()
                    print("connected", address)
                except OSError as err:
                    print("failed", address, type(err).__name__)
            """)
        with pytest.raises(BlockingIOError):
            server.accept()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 3 and all(line.startswith("failed") for line in lines), lines


def test_etc_passwd_and_the_repository_cannot_be_read():
    result = run(f"""
        import os
        for path in ("/etc/passwd", "/etc/shadow", {str(REPO / "README.md")!r},
                     {str(Path(__file__).resolve())!r}, "/root/.bashrc"):
            try:
                print("read", path, len(open(path).read()))
            except OSError as err:
                print("failed", path, type(err).__name__)
        print("root", sorted(os.listdir("/")))
        """)
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 6 and all(line.startswith("failed") for line in lines[:-1]), lines
    visible = set(eval(lines[-1].removeprefix("root ")))
    assert {"usr", "tmp", "sandbox", "proc", "dev"} <= visible
    # the repo's top folder, unless it is one the sandbox has of its own (a clone under /tmp:
    # the reads above already show its files are not there)
    hidden = {"etc", "root", "home", "work", REPO.parts[1]} - {"tmp", "usr", "proc", "dev"}
    assert not visible & hidden


def test_allocating_10_gb_fails_inside_the_sandbox():
    result = run("""
        try:
            block = bytearray(10 * 2**30)
            print("allocated", len(block))
        except MemoryError:
            print("refused")
        """)
    assert result.stdout.strip() == b"refused"
    assert result.wall_s < 5.0


def test_printing_1_gb_is_cut_at_the_output_limit():
    result = run("""
        import sys
        chunk = "x" * 65536
        for _ in range(2**30 // 65536):
            sys.stdout.write(chunk)
        """)
    assert result.output_exceeded and not result.finished
    assert len(result.stdout) == LIMITS.max_output_bytes
    assert result.wall_s < 5.0


def test_an_infinite_loop_is_killed_at_the_time_limit():
    start = time.monotonic()
    result = run("while True:\n    pass\n")
    assert not result.finished and (result.timed_out or result.returncode != 0)
    assert time.monotonic() - start < LIMITS.time_limit_s + LIMITS.startup_allowance_s + 1.5


def test_a_daemon_does_not_outlive_the_run():
    marker = f"daemon-{uuid.uuid4().hex}"
    result = run(f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 3)
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)",
                                          "{marker}"])
            os._exit(0)
        os.wait()
        import time
        for _ in range(100):  # wait until the daemon runs (seen in the sandbox's own /proc)
            running = [p for p in os.listdir("/proc") if p.isdigit()
                       and "{marker}".encode() in open(f"/proc/{{p}}/cmdline", "rb").read()]
            if running:
                break
            time.sleep(0.02)
        print("daemon running" if running else "no daemon")
        """)
    assert result.stdout.strip() == b"daemon running" and result.finished
    time.sleep(0.3)
    assert processes_with(marker) == []


def test_killing_the_caller_kills_the_sandbox():
    """The reward runner kills a worker past its deadline: its sandbox must go with it."""
    marker = f"orphan-{uuid.uuid4().hex}"
    # the marker is spelled backwards here, so only the sandboxed process's command line holds it
    program = (
        f"import os, sys; os.execv(sys.executable, [sys.executable, '-c', "
        f"'import time; time.sleep(60)', '{marker[::-1]}'[::-1]])"
    )
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        from sparrow.data.code_reward import program_box, run_test
        from sparrow.data.sandbox import SandboxLimits
        with program_box({program!r}) as box:
            run_test(box, 0, "", SandboxLimits(time_limit_s=60.0))
        """),
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 10.0
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker), "the sandboxed program never started"
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 2.0
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_a_run_leaves_no_temp_folder_behind():
    before = {p.name for p in Path("/tmp").glob("sparrow-code-*")}
    assert run("print(1)").stdout == b"1\n"
    assert {p.name for p in Path("/tmp").glob("sparrow-code-*")} <= before
