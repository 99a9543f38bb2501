"""One cgroup per sandboxed run: a total memory and process limit over all its processes.

    group = RunCgroup.create(memory_bytes=1 << 30, max_processes=34)   # CgroupUnavailable if not
    command = group.join_command() + bwrap_args    # /bin/sh joins the group, then execs bwrap
    ...run it...
    group.finish()    # kill whatever is left, check that nothing is, remove the folders

cgroup v2 where the machine has its memory and pids controllers (a folder whose
cgroup.subtree_control lists both and that this process may write: `cgroup_parent`, else
the caller's own cgroup); else cgroup v1's memory and pids hierarchies (hybrid hosts, as
Docker on older systems and this project's CI machine), a folder under the caller's own
cgroup in each. Each run gets folders of its own: memory.max (v1: memory.limit_in_bytes,
and memsw when swap is accounted) counts every page of the run's processes and of its tmpfs,
pids.max every process and thread. The process is put in the group before bwrap starts (a
shell writes its own pid to cgroup.procs, then execs), so nothing of the run is ever outside
it. Why not systemd-run --scope: it needs a running systemd and a D-Bus round trip per run
(docs/code_rl.md). Tests: tests/data/test_sandbox_limits.py.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sparrow.data.sandbox_process import SandboxEscapeError
from sparrow.errors import SparrowError

_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_COUNTER = itertools.count()


class CgroupUnavailable(SparrowError, RuntimeError):
    """No cgroup this process may make run groups in; the message says why."""


@functools.lru_cache(maxsize=8)
def find_places(parent: str = "") -> tuple[int, tuple[Path, ...]]:
    """(cgroup version, folders to make run groups in); CgroupUnavailable saying why not."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    reasons = []
    v2_parent = Path(parent) if parent else None
    if v2_parent is None and "" in own and "cgroup2" in mounts:
        v2_parent = _inside(mounts["cgroup2"], own[""])
    if v2_parent is not None:
        controllers = _read(v2_parent / "cgroup.subtree_control").split()
        if {"memory", "pids"} <= set(controllers) and os.access(v2_parent, os.W_OK):
            return 2, (v2_parent,)
        reasons.append(
            f"cgroup v2 {v2_parent}: subtree_control {controllers or 'empty'}"
            f"{'' if os.access(v2_parent, os.W_OK) else ', not writable'}"
        )
    if parent:
        raise CgroupUnavailable(f"cgroup_parent needs memory and pids delegated ({reasons[0]})")
    folders = []
    for controller in ("memory", "pids"):
        if controller in mounts and controller in own:
            folder = _inside(mounts[controller], own[controller])
            if os.access(folder, os.W_OK):
                folders.append(folder)
                continue
            reasons.append(f"cgroup v1 {folder} not writable")
        else:
            reasons.append(f"no cgroup v1 {controller} hierarchy")
    if len(folders) == 2:
        return 1, tuple(folders)
    raise CgroupUnavailable("; ".join(reasons))


@dataclass(frozen=True)
class RunCgroup:
    """The cgroup folders of one run: one on v2, a memory and a pids folder on v1."""

    version: int
    folders: tuple[Path, ...]
    _killed_at_limit: threading.Event = field(default_factory=threading.Event, compare=False)

    @classmethod
    def create(cls, memory_bytes: int, max_processes: int, parent: str = "") -> RunCgroup:
        version, places = find_places(parent)
        _sweep(places)
        name = f"sparrow-sandbox-{os.getpid()}-{next(_COUNTER)}-{uuid.uuid4().hex[:6]}"
        group = cls(version, tuple(place / name for place in places))
        try:
            for folder in group.folders:
                folder.mkdir()
            for path, value in group._limit_files(memory_bytes, max_processes):
                if path.exists():
                    path.write_text(str(value))
        except OSError as err:
            group._remove()
            raise CgroupUnavailable(f"cannot make a run cgroup under {places[0]}: {err}") from None
        return group

    def _limit_files(self, memory_bytes: int, max_processes: int) -> list[tuple[Path, int]]:
        if self.version == 2:
            folder = self.folders[0]
            # oom.group: one out-of-memory kill takes the whole run, not one process of it
            return [
                (folder / "memory.max", memory_bytes),
                (folder / "memory.swap.max", 0),
                (folder / "memory.oom.group", 1),
                (folder / "pids.max", max_processes),
            ]
        memory, pids = self.folders
        return [
            (memory / "memory.limit_in_bytes", memory_bytes),
            (memory / "memory.memsw.limit_in_bytes", memory_bytes),  # where swap is accounted
            # oom_kill_disable: at the limit the run's processes wait instead of one of them
            # being killed; watch_memory kills all of them (v2's oom.group, by hand)
            (memory / "memory.oom_control", 1),
            (pids / "pids.max", max_processes),
        ]

    def join_command(self) -> list[str]:
        """A prefix that puts the command in this group before it runs (needs /bin/sh)."""
        return ["/bin/sh", "-c", _JOIN, "sh"] + [str(f / "cgroup.procs") for f in self.folders]

    def memory_exceeded(self) -> bool:
        """An out-of-memory kill happened in the group."""
        if self._killed_at_limit.is_set():
            return True
        if self.version == 2:
            events = _read(self.folders[0] / "memory.events")
        else:
            events = _read(self.folders[0] / "memory.oom_control")
        return int(_counts(events).get("oom_kill", "0")) > 0

    @contextmanager
    def watch_memory(self) -> Iterator[None]:
        """While inside: on cgroup v1, the whole run is killed once it reaches its memory limit
        (v1 has no oom.group: its kernel would kill one process and let the others go on, so a
        run of many processes could keep taking memory back). Nothing to do on v2."""
        memory = self.folders[0]
        if (
            self.version == 2
            or _counts(_read(memory / "memory.oom_control")).get("oom_kill_disable") != "1"
        ):
            yield
            return
        stop = threading.Event()
        watcher = threading.Thread(target=self._kill_at_limit, args=(stop,), daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()

    def _kill_at_limit(self, stop: threading.Event) -> None:
        control = self.folders[0] / "memory.oom_control"
        notice = _oom_notice(self.folders[0], control)
        try:
            while not stop.is_set():
                if notice is not None:
                    ready, _, _ = select.select([notice], [], [], 0.05)
                    if ready:
                        os.eventfd_read(notice)
                else:
                    time.sleep(0.005)
                if _counts(_read(control)).get("under_oom") == "1":
                    self._killed_at_limit.set()
                    for pid in self.processes():
                        _signal(pid)
        finally:
            if notice is not None:
                os.close(notice)

    def processes(self) -> list[int]:
        return sorted({int(p) for f in self.folders for p in _read(f / "cgroup.procs").split()})

    def finish(self, timeout_s: float = 5.0) -> int:
        """SIGKILL every process still in the group, wait until none is, remove the folders.
        Returns how many were found; SandboxEscapeError if some outlive timeout_s."""
        found = self.processes()
        kill_file = self.folders[0] / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        left = found
        while left:
            if self.version == 2 and kill_file.exists():
                kill_file.write_text("1")
            else:  # v1: no cgroup.kill; pids.max bounds how many can appear meanwhile
                for pid in left:
                    _signal(pid)
            if time.monotonic() > deadline:
                raise SandboxEscapeError(
                    f"processes {left} of a finished sandbox run outlived SIGKILL for "
                    f"{timeout_s} s (cgroup {self.folders[0]})"
                )
            time.sleep(0.002)
            left = self.processes()
        self._remove(deadline)
        return len(found)

    def _remove(self, deadline: float = 0.0) -> None:
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:  # EBUSY while the last exits are being reaped
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    time.sleep(0.002)


@functools.lru_cache(maxsize=8)
def _sweep(places: tuple[Path, ...]) -> None:
    """Once per process: remove the empty run groups of callers that died (SIGKILLed mid-run,
    their own cleanup never ran); rmdir refuses a group that still holds a process."""
    for place in places:
        for folder in place.glob("sparrow-sandbox-*"):
            pid = folder.name.split("-")[2]
            if pid.isdigit() and not Path("/proc", pid).exists():
                try:
                    folder.rmdir()
                except OSError:
                    pass


def _signal(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _oom_notice(folder: Path, control: Path) -> int | None:
    """An eventfd that v1's cgroup.event_control makes readable at each out-of-memory event;
    None where it cannot be set up (the watcher then reads the control file every 5 ms)."""
    notice = os.eventfd(0)
    try:
        with open(control) as watched:
            (folder / "cgroup.event_control").write_text(f"{notice} {watched.fileno()}")
    except OSError:
        os.close(notice)
        return None
    return notice


def _counts(text: str) -> dict[str, str]:
    return dict(line.split() for line in text.splitlines() if len(line.split()) == 2)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """Controller (or 'cgroup2') -> (root inside the hierarchy, mount point), from mountinfo."""
    mounts = {}
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        fields = line.split()
        separator = fields.index("-")
        kind, root, point = fields[separator + 1], fields[3], fields[4]
        if kind == "cgroup2":
            mounts.setdefault("cgroup2", (root, point))
        elif kind == "cgroup":
            for option in fields[separator + 3].split(","):
                mounts.setdefault(option, (root, point))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """Controller ('' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _inside(mount: tuple[str, str], path: str) -> Path:
    root, point = mount
    return Path(point) / os.path.relpath(path, root)
