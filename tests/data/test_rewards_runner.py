"""The reward runner: failures and timeouts score 0 and are counted, workers never leak."""

import os
import pickle
import sys
import time
import types

import pytest

from sparrow.data import rewards
from sparrow.data.reward_runner import RewardBatch, RewardRunnerError, score_completions


def flaky_reward(completion: str, answer: str) -> float:
    """Misbehaves on request; the workers import this module to find it."""
    if completion == "raise":
        raise ValueError("bad sample")
    if completion == "sleep":
        time.sleep(30)
    if completion == "hang":
        return float(9 ** (9**9) % 7)  # one C-level big-int power: holds the GIL for minutes
    if completion == "crash":
        os._exit(3)
    if completion == "nan":
        return float("nan")
    return float(completion) * float(answer)


@pytest.fixture
def register(monkeypatch):
    """Register a reward function for one test only (the registry has no unregister)."""

    def add(name, function):
        monkeypatch.setitem(rewards.REWARD_FUNCTIONS._entries, name, function)

    return add


def children_of_this_process() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            pids.append(int(entry))
    return pids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="counts child processes through /proc")
def test_failures_and_timeouts_score_zero_and_are_counted(register):
    register("test_flaky", flaky_reward)
    completions = ["1.5", "raise", "0.25", "sleep", "crash", "hang", "nan", "2"]
    # processes this one had before (a local Ray an earlier test of this worker started) stay
    before = set(children_of_this_process())
    started = time.monotonic()
    batch = score_completions("test_flaky", completions, ["2"] * 8, timeout_s=0.2, workers=3)
    elapsed = time.monotonic() - started
    assert batch.rewards == [3.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 4.0]
    assert (batch.errors, batch.timeouts) == (3, 2)  # raise, crash, nan / sleep, hang
    assert batch.first_error == "sample 1: ValueError: bad sample"
    assert elapsed < 20  # the sleeping and hanging calls were cut off, not waited for
    # killed workers are gone, the rest shut down
    left = set(children_of_this_process()) - before
    assert not left, [_cmdline(p) for p in left]


def test_results_keep_input_order_across_workers():
    completions = [f"work\nAnswer: {i % 7}" for i in range(40)]
    answers = [str(i % 5) for i in range(40)]
    batch = score_completions("exact_match", completions, answers, timeout_s=5.0, workers=2)
    want = [rewards.exact_match_reward(c, a) for c, a in zip(completions, answers)]
    assert batch.rewards == want and sum(want) > 0
    assert (batch.errors, batch.timeouts, batch.first_error) == (0, 0, None)


def test_unpicklable_function_is_refused_before_any_process_starts(register):
    register("test_lambda", lambda completion, answer: 1.0)
    with pytest.raises(RewardRunnerError, match="module level"):
        score_completions("test_lambda", ["a"], ["a"])


def test_function_the_workers_cannot_import_fails_the_batch(register, monkeypatch):
    ghost = types.ModuleType("sparrow_ghost_rewards")
    exec("def reward(completion, answer):\n    return 1.0\n", ghost.__dict__)
    monkeypatch.setitem(sys.modules, "sparrow_ghost_rewards", ghost)
    pickle.dumps(ghost.reward)  # picklable here, but no worker can import its module
    register("test_ghost", ghost.reward)
    with pytest.raises(RewardRunnerError, match="before it was ready"):
        score_completions("test_ghost", ["a"], ["a"], timeout_s=1.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "nope"}, "valid: .*exact_match"),
        ({"answers": ["1"]}, "2 completions but 1 answers"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"workers": 0}, "workers"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, match):
    call = {"name": "exact_match", "completions": ["1", "2"], "answers": ["1", "2"], **kwargs}
    with pytest.raises(RewardRunnerError, match=match):
        score_completions(**call)


def test_empty_batch_and_batch_invariants():
    assert score_completions("math", [], []) == RewardBatch([], 0, 0, None)
    with pytest.raises(RewardRunnerError, match="first_error"):
        RewardBatch([0.0], errors=1, timeouts=0, first_error=None)
    with pytest.raises(RewardRunnerError, match="do not fit"):
        RewardBatch([0.0], errors=1, timeouts=1, first_error="x")


@pytest.mark.slow
def test_math_through_the_runner_cuts_off_a_runaway_comparison():
    completions = [r"\boxed{\frac{1}{2}}", r"\boxed{9^{9^{9}}}", r"\boxed{3}"]
    batch = score_completions("math", completions, ["0.5", "5", "4"], timeout_s=2.0, workers=2)
    assert batch.rewards == [1.0, 0.0, 0.0]
    assert (batch.errors, batch.timeouts) == (0, 1)
    assert batch.first_error == "sample 1: timed out after 2 s"
