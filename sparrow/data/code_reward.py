"""Code rewards: run the program of a completion against its row's tests, in a sandbox.

    from sparrow.data.rewards import REWARD_FUNCTIONS
    REWARD_FUNCTIONS.get("code")(completion, answer)        # share of tests passed
    REWARD_FUNCTIONS.get("code_all")(completion, answer)    # 1.0 when every test passes
    CodeReward(SandboxLimits(time_limit_s=4.0))             # other limits (file.py:name spec)

The program is the last complete ```python (or ```py, ```python3) block of the completion,
else its last untagged ``` block, else the whole text (code-RL datasets prompt for a fenced
block; a bare program still runs). `answer` is the row's tests as JSON (code_datasets.py
writes it): {"inputs": [...], "outputs": [...], "fn_name": optional, "time_limit_s": optional}.
Without fn_name each test feeds inputs[i] on stdin and passes when stdout equals outputs[i]
line by line, each line's whitespace runs collapsed, blank lines at either end ignored. With
fn_name, inputs[i] is the argument list of one call and the test passes when the return
value equals outputs[i] (JSON values; numbers within 1e-6; or equals outputs[i][0], since
TACO wraps expected values in a one-element list). A test whose run crashes, exits non-zero,
runs past its limit or prints too much fails. Every test runs in a fresh bwrap sandbox
(sandbox.py); without bwrap the reward raises SandboxUnavailableError. Tests:
tests/data/test_code_reward.py, test_sandbox.py; docs/code_rl.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sparrow.data.rewards import REWARD_FUNCTIONS
from sparrow.data.sandbox import RunResult, SandboxLimits, check_sandbox, run_in_sandbox

HARNESS = Path(__file__).with_name("code_harness.py")
_TAGGED = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
_UNTAGGED = re.compile(r"```[ \t]*\r?\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class CodeTests:
    """One row's tests: inputs[i] -> outputs[i]; fn_name for function-call tests."""

    inputs: tuple
    outputs: tuple
    fn_name: str | None = None
    time_limit_s: float | None = None


def parse_tests(answer: str) -> CodeTests:
    """The tests of a row's answer; ValueError for anything but well-formed tests."""
    try:
        data = json.loads(answer)
    except json.JSONDecodeError as err:
        raise ValueError(f"the answer is not the tests as JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise ValueError("the answer must be a JSON object with inputs and outputs")
    inputs, outputs = data.get("inputs"), data.get("outputs")
    if (
        not isinstance(inputs, list)
        or not isinstance(outputs, list)
        or not inputs
        or len(inputs) != len(outputs)
    ):
        raise ValueError("the tests need non-empty lists inputs and outputs of equal length")
    fn_name = data.get("fn_name") or None
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise ValueError(f"fn_name must be a Python identifier, got {fn_name!r}")
    time_limit = data.get("time_limit_s")
    if time_limit is not None and not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"time_limit_s must be a number > 0, got {time_limit!r}")
    if fn_name is None:
        inputs, outputs = [_as_text(v) for v in inputs], [_as_text(v) for v in outputs]
    return CodeTests(tuple(inputs), tuple(outputs), fn_name, time_limit)


def _as_text(value) -> str:
    """A stdio test's input or output; APPS-style rows sometimes give a list of lines."""
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def extract_program(completion: str) -> str:
    """The program of a completion (see the module doc)."""
    for pattern in (_TAGGED, _UNTAGGED):
        blocks = pattern.findall(completion)
        if blocks:
            return blocks[-1]
    return completion


def normalised_lines(text: str) -> list[str]:
    lines = [" ".join(line.split()) for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def same_stdout(actual: str, expected: str) -> bool:
    return normalised_lines(actual) == normalised_lines(expected)


def same_value(actual, expected) -> bool:
    """JSON values equal; numbers (not booleans) within 1e-6 relative or absolute."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual is expected
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(map(same_value, actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            same_value(actual[k], expected[k]) for k in actual
        )
    return actual == expected


def _passes_call(stdout: bytes, expected) -> bool:
    try:
        actual = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if same_value(actual, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and same_value(actual, expected[0])


def run_tests(
    program: str, tests: CodeTests, limits: SandboxLimits, stop_at_failure: bool = False
) -> list[bool]:
    """Whether each test passes (stop_at_failure: none run after the first that fails)."""
    if tests.time_limit_s is not None:
        limits = dataclasses.replace(limits, time_limit_s=float(tests.time_limit_s))
    passed = []
    with program_box(program) as box:
        for index, (given, expected) in enumerate(zip(tests.inputs, tests.outputs)):
            result = run_test(box, index, given, limits, tests.fn_name)
            ok = result.finished and (
                _passes_call(result.stdout, expected)
                if tests.fn_name
                else same_stdout(result.stdout.decode("utf-8", "replace"), expected)
            )
            passed.append(ok)
            if stop_at_failure and not ok:
                break
    return passed


@contextlib.contextmanager
def program_box(program: str) -> Iterator[Path]:
    """A host folder with the program and the harness, seen read-only as /sandbox; removed
    on exit. Test inputs are added to it by run_test."""
    box = Path(tempfile.mkdtemp(prefix="sparrow-code-"))
    try:
        _write(box / "program.py", program)
        _write(box / "harness.py", HARNESS.read_text())
        os.chmod(box, 0o755)  # a root caller's sandbox runs as nobody and must read it
        yield box
    finally:
        shutil.rmtree(box, ignore_errors=True)


def run_test(
    box: Path, index: int, given, limits: SandboxLimits, fn_name: str | None = None
) -> RunResult:
    """Run test `index` of the program in `box`: `given` on stdin, or as fn_name's arguments."""
    rlimits = json.dumps(limits.rlimits())
    if fn_name is None:
        _write(box / f"{index}.in", given)
        args = ["/sandbox/harness.py", "stdin", str(index), rlimits]
    else:
        _write(box / f"{index}.json", json.dumps(given))
        args = ["/sandbox/harness.py", "call", str(index), rlimits, fn_name]
    return run_in_sandbox(box, args, limits)


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)


class CodeReward:
    """reward(completion, answer): the share of tests passed, or with all_pass 1.0 / 0.0."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), all_pass: bool = False):
        self.limits, self.all_pass = limits, all_pass

    def __call__(self, completion: str, answer: str) -> float:
        check_sandbox(self.limits)  # never run untrusted code without the sandbox
        tests = parse_tests(answer)
        passed = run_tests(
            extract_program(completion), tests, self.limits, stop_at_failure=self.all_pass
        )
        if self.all_pass:
            return 1.0 if len(passed) == len(tests.inputs) and all(passed) else 0.0
        return sum(passed) / len(tests.inputs)

    def preflight(self) -> None:
        """Run by the reward runner and the config check before any sample: bwrap is here, and
        a cgroup where the limits require one."""
        check_sandbox(self.limits)

    def __repr__(self) -> str:
        return f"CodeReward({self.limits!r}, all_pass={self.all_pass})"


REWARD_FUNCTIONS.register("code")(CodeReward())
REWARD_FUNCTIONS.register("code_all")(CodeReward(all_pass=True))
