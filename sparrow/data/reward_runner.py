"""Score a batch of completions with a registered reward function, each call under a timeout.

    from sparrow.data.reward_runner import score_completions
    batch = score_completions("math", completions, answers, timeout_s=10.0)
    batch.rewards, batch.errors, batch.timeouts, batch.first_error

A call that raises, returns something that is not a finite number, kills its process, or runs
past timeout_s scores 0 and is counted; the batch never fails because of one sample.

How the timeout works: calls run in a few worker processes (reward_worker.py, started with
`python -m`, so the caller's __main__ is never re-imported). A call past its deadline has its
worker killed and a fresh one started, so no abandoned work keeps running. Threads cannot do
this: math-verify can spend minutes inside one C-level big-integer operation (e.g. comparing
9^{9^{9}}) that holds the GIL, starving a watching thread, and a thread cannot be stopped from
outside (signal-based timeouts only work in a main thread).
The function travels to the workers by reference (pickle), so it must be defined at module
level in an importable module. The clock starts when a worker has loaded the function and
run its optional warm_up(), not while the worker is still starting. A function's optional
preflight() runs once in the caller first (the code reward checks for bwrap there). POSIX
only (the worker inherits its socket through pass_fds).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait

from sparrow.data.reward_spec import (
    RewardSpecError,
    is_spec,
    load_reward,
    picklable_reward,
    reward_keywords,
)
from sparrow.errors import SparrowError

MAX_DEFAULT_WORKERS = 8
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT_S = 120.0


class RewardRunnerError(SparrowError, ValueError):
    """The batch itself cannot be scored (bad arguments, or a reward function workers cannot load)."""


@dataclass(frozen=True)
class RewardBatch:
    """Rewards in input order; errors and timeouts count the samples that scored 0 for those
    reasons; first_error describes the first failed sample (None when none failed), and
    first_traceback is the traceback of the first sample whose call raised (None if none did)."""

    rewards: list[float]
    errors: int
    timeouts: int
    first_error: str | None
    first_traceback: str | None = None

    def __post_init__(self) -> None:
        if self.errors < 0 or self.timeouts < 0 or self.errors + self.timeouts > len(self.rewards):
            raise RewardRunnerError(
                f"RewardBatch counts errors={self.errors} timeouts={self.timeouts} "
                f"do not fit {len(self.rewards)} rewards"
            )
        if (self.first_error is None) != (self.errors + self.timeouts == 0):
            raise RewardRunnerError(
                "RewardBatch.first_error must be set exactly when a sample failed"
            )


def score_completions(
    name: str,
    completions: Sequence[str],
    answers: Sequence[str],
    timeout_s: float = 10.0,
    *,
    workers: int | None = None,
    data_sources: Sequence[str] | None = None,
    extra_infos: Sequence[str | dict] | None = None,
) -> RewardBatch:
    """Score completions[i] against answers[i] with the reward function `name` names: a
    registry name, module:function or file.py:function (reward_spec.py; see module doc).

    workers: processes to use (default min(samples, CPUs, 8)). data_sources, extra_infos:
    per sample, passed as the keyword arguments `data_source` and `extra_info` (a dict; JSON
    text is decoded, "" is {}) to a function whose signature takes them, as verl's
    compute_score(data_source, solution_str, ground_truth, extra_info) does.
    """
    try:
        function = load_reward(name)
    except RewardSpecError as err:
        raise RewardRunnerError(str(err)) from None
    run_preflight(name, function)
    if len(completions) != len(answers):
        raise RewardRunnerError(
            f"{len(completions)} completions but {len(answers)} answers; they must pair up"
        )
    if not timeout_s > 0:
        raise RewardRunnerError(f"timeout_s must be > 0, got {timeout_s}")
    if workers is not None and workers < 1:
        raise RewardRunnerError(f"workers must be >= 1, got {workers}")
    keywords = _keywords(function, len(completions), data_sources, extra_infos)
    jobs = list(zip(map(str, completions), map(str, answers), keywords))
    if not jobs:
        return RewardBatch(rewards=[], errors=0, timeouts=0, first_error=None)
    try:
        function_bytes = pickle.dumps(picklable_reward(name) if is_spec(name) else function)
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        raise RewardRunnerError(
            f"reward function {name!r} cannot be sent to a worker process ({err}); "
            "define it at module level in an importable module"
        ) from None
    count = min(len(jobs), workers or min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS))
    outcomes = _Pool(name, function_bytes, count).run(jobs, timeout_s)
    return _summarise(outcomes)


def _keywords(function, count: int, data_sources, extra_infos) -> list[dict]:
    """Per sample, the keyword arguments among data_source and extra_info the function takes."""
    taken = reward_keywords(function)
    columns = {"data_source": data_sources, "extra_info": extra_infos}
    for key, values in columns.items():
        if values is not None and len(values) != count:
            raise RewardRunnerError(f"{len(values)} {key} values for {count} completions")
    out = []
    for index in range(count):
        kwargs = {}
        if "data_source" in taken:
            kwargs["data_source"] = str(data_sources[index]) if data_sources is not None else ""
        if "extra_info" in taken:
            info = extra_infos[index] if extra_infos is not None else ""
            kwargs["extra_info"] = json.loads(info) if isinstance(info, str) and info else {}
            if isinstance(info, dict):
                kwargs["extra_info"] = info
        out.append(kwargs)
    return out


def run_preflight(name: str, function: object) -> None:
    """A function's optional `preflight()` (the code reward checks its sandbox is installed):
    run once here, before any worker starts, its error is the batch's one clear error."""
    preflight = getattr(function, "preflight", None)
    if not callable(preflight):
        return
    try:
        preflight()
    except Exception as err:
        raise RewardRunnerError(f"reward function {name!r} cannot run here: {err}") from None


def _summarise(outcomes: list[tuple]) -> RewardBatch:
    rewards, errors, timeouts, first_error, first_traceback = [], 0, 0, None, None
    for index, (kind, payload, *trace) in enumerate(outcomes):
        if kind == "ok":
            rewards.append(float(payload))
            continue
        rewards.append(0.0)
        errors += kind == "error"
        timeouts += kind == "timeout"
        first_error = first_error or f"sample {index}: {payload}"
        if kind == "error" and trace and trace[0]:
            first_traceback = first_traceback or trace[0]
    return RewardBatch(
        rewards=rewards,
        errors=errors,
        timeouts=timeouts,
        first_error=first_error,
        first_traceback=first_traceback,
    )


class _Worker:
    """The parent's handle on one worker process and the job it is running."""

    def __init__(self, function_bytes: bytes):
        self.conn, child = multiprocessing.Pipe()
        env = dict(os.environ)
        # the worker must import this package even when the parent found it through sys.path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sparrow.data.reward_worker", str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                # a reward function's prints must not mix with a command's JSON on stdout
                stdout=2,
            )
        finally:
            child.close()
        try:
            self.conn.send(sys.path)
            self.conn.send_bytes(function_bytes)
        except OSError:
            pass  # the worker died at once; the pool sees its EOF and reports it
        self.started = time.monotonic()
        self.ready = False
        self.job: int | None = None
        self.deadline = math.inf

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.conn.send(None)
                self.process.wait(timeout=5.0)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if kill:
            self.process.kill()
            self.process.wait()
        self.conn.close()


class _Pool:
    """Runs jobs on up to `size` workers, replacing any worker killed for a timeout."""

    def __init__(self, name: str, function_bytes: bytes, size: int):
        self.name, self.function_bytes, self.size = name, function_bytes, size
        self.workers: list[_Worker] = []

    def run(self, jobs: list[tuple[str, str, dict]], timeout_s: float) -> list[tuple[str, object]]:
        outcomes: list[tuple[str, object] | None] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        try:
            while pending or any(w.job is not None for w in self.workers):
                self._top_up(len(pending))
                self._dispatch(jobs, pending, timeout_s)
                self._collect(outcomes)
                self._expire(outcomes, timeout_s)
        finally:
            for worker in self.workers:
                # a busy or still-starting worker has nothing left to give: do not wait for it
                worker.stop(kill=worker.job is not None or not worker.ready)
        assert all(outcome is not None for outcome in outcomes)
        return outcomes  # type: ignore[return-value]

    def _top_up(self, pending: int) -> None:
        idle = sum(w.job is None for w in self.workers)
        while len(self.workers) < self.size and idle < pending:
            self.workers.append(_Worker(self.function_bytes))
            idle += 1

    def _dispatch(self, jobs, pending: deque, timeout_s: float) -> None:
        for worker in self.workers:
            if worker.ready and worker.job is None and pending:
                index = pending.popleft()
                worker.conn.send((index, *jobs[index]))
                worker.job, worker.deadline = index, time.monotonic() + timeout_s

    def _collect(self, outcomes: list) -> None:
        deadlines = [w.deadline if w.ready else w.started + STARTUP_TIMEOUT_S for w in self.workers]
        delay = max(0.0, min(deadlines) - time.monotonic())
        for conn in wait([w.conn for w in self.workers], timeout=delay):
            worker = next(w for w in self.workers if w.conn is conn)
            try:
                message = conn.recv()
            except EOFError:
                self._lost(worker, outcomes)
                continue
            if message == ("ready",):
                worker.ready = True
            else:
                index, *outcome = message  # (kind, payload) or ("error", message, traceback)
                outcomes[index] = tuple(outcome)
                worker.job, worker.deadline = None, math.inf

    def _lost(self, worker: _Worker, outcomes: list) -> None:
        """A worker's process ended without answering: its sample fails, or the batch if it
        never started (the reward function cannot be loaded there)."""
        code = worker.process.wait()
        self.workers.remove(worker)
        worker.conn.close()
        if not worker.ready:
            raise RewardRunnerError(
                f"a worker process for reward function {self.name!r} exited with code {code} "
                "before it was ready; is the function importable outside this process?"
            )
        if worker.job is not None:
            outcomes[worker.job] = ("error", f"worker process exited with code {code}")

    def _expire(self, outcomes: list, timeout_s: float) -> None:
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.job is not None and now >= worker.deadline:
                outcomes[worker.job] = ("timeout", f"timed out after {timeout_s:g} s")
                worker.stop(kill=True)
                self.workers.remove(worker)
            elif not worker.ready and now >= worker.started + STARTUP_TIMEOUT_S:
                raise RewardRunnerError(
                    f"a worker process for reward function {self.name!r} did not start "
                    f"within {STARTUP_TIMEOUT_S:g} s"
                )
