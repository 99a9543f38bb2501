"""Reward functions (registry REWARD_FUNCTIONS): reward(completion, answer) -> float.

    from sparrow.data.rewards import REWARD_FUNCTIONS
    REWARD_FUNCTIONS.get("math")(r"... so the total is \\boxed{\\frac{1}{2}}", "0.5")    # 1.0

- "math": the last complete \\boxed{...} of the completion after its thinking block (the text
  after the last </think>; a block never closed scores 0), nested braces handled, compared
  with the ground truth by math-verify; no boxed answer scores 0.
- "exact_match": the completion's final answer (text after the last "Answer:", else its last
  non-empty line), stripped, equals the stripped ground truth.
- "share_match": the share of the ground truth's space-separated answers that the final
  answer (as exact_match reads it) matches word for word at the same place: multi_chase's
  graded reward, where each of K chains is 1/K; equal to exact_match for a one-word answer.
- "code", "code_all": the completion's program run against the row's tests inside a bwrap
  sandbox (code_reward.py, registered at the end of this module; docs/code_rl.md).

These functions have no timeout of their own: math-verify's signal-based timeouts work only
in a main thread, so they are switched off here and the batch runner (reward_runner.py) times
each call in a worker process instead. Rules and how to add a function: docs/rewards.md.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from sparrow.registry import Registry

RewardFunction = Callable[[str, str], float]
REWARD_FUNCTIONS: Registry[RewardFunction] = Registry("reward function")

ANSWER_MARKER = "Answer:"
_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last complete \\boxed{...} in `text`, or None.

    Braces nest; a backslash escapes the next character, so \\{ and \\} are not group
    delimiters. An unterminated \\boxed{ (a truncated completion) is skipped in favour of the
    last complete one before it.
    """
    for match in reversed(list(_BOXED.finditer(text))):
        content = _braced_content(text, match.end())
        if content is not None:
            return content.strip()
    return None


def _braced_content(text: str, start: int) -> str | None:
    """Text from `start` up to the brace closing the one just before it, or None if unclosed."""
    depth, i = 1, start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def final_response(completion: str) -> str | None:
    """The part of a completion that holds its answer: after the last </think> when there is
    one; None when a <think> block was opened and never closed (cut while thinking)."""
    close = completion.rfind(THINK_CLOSE)
    if close >= 0:
        return completion[close + len(THINK_CLOSE) :]
    return None if THINK_OPEN in completion else completion


def math_well_formed(completion: str) -> bool:
    """True when the thinking block (if any) is closed and a non-empty \\boxed{} follows it."""
    region = final_response(completion)
    return region is not None and bool(last_boxed(region))


@REWARD_FUNCTIONS.register("math")
def math_reward(completion: str, answer: str) -> float:
    """1.0 when the last boxed answer after the thinking block equals the ground truth
    mathematically, else 0.0 (also for a completion cut inside its thinking block).

    The ground truth may itself hold a \\boxed{...} (its content is used) or be bare LaTeX or
    a number. A ground truth math-verify cannot read at all is an error, not a 0.
    """
    region = final_response(completion)
    if region is None:
        return 0.0
    predicted = last_boxed(region)
    if predicted is None or not predicted:
        return 0.0
    gold = _parse_gold(answer)
    from math_verify import parse, verify

    parsed = parse(r"\boxed{" + predicted + "}", parsing_timeout=None)
    if not parsed:
        return 0.0
    return 1.0 if verify(gold, parsed, timeout_seconds=None) else 0.0


def _warm_up_math() -> None:
    """Import math-verify and parse once (the reward runner calls this before timing starts)."""
    _parse_gold("1")


math_reward.warm_up = _warm_up_math  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    """Parse a ground truth once: the samples of one prompt share it."""
    _quiet_math_verify()
    from math_verify import parse

    text = last_boxed(answer)
    text = answer.strip() if text is None else text
    if not text:
        raise ValueError("the ground-truth answer is empty")
    gold = parse(r"\boxed{" + text + "}", parsing_timeout=None)
    if not gold:
        raise ValueError(f"math-verify cannot parse the ground-truth answer {answer!r}")
    return gold


@functools.cache
def _quiet_math_verify() -> None:
    """Drop math-verify's warning that its own timeout is off: the runner supplies one."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(keep)


def final_answer(completion: str) -> str:
    """The text exact_match compares: after the last "Answer:" marker, else the last line.

    After the marker, the first non-empty line of what follows is taken (so "Answer: 42" and
    "Answer:\\n42" both give "42", and later chatter on new lines is ignored). Without a
    marker, the last non-empty line. Either way stripped of surrounding whitespace.
    """
    marker = completion.rfind(ANSWER_MARKER)
    if marker >= 0:
        lines = completion[marker + len(ANSWER_MARKER) :].splitlines()
        return next((line.strip() for line in lines if line.strip()), "")
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@REWARD_FUNCTIONS.register("exact_match")
def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 when final_answer(completion) equals answer.strip() character for character."""
    return 1.0 if final_answer(completion) == answer.strip() else 0.0


@REWARD_FUNCTIONS.register("share_match")
def share_match_reward(completion: str, answer: str) -> float:
    """Share of answer.split() equal, place by place, to final_answer(completion).split();
    a missing word is a miss, words past the last place are not read."""
    gold, predicted = answer.split(), final_answer(completion).split()
    if not gold:
        raise ValueError("the ground-truth answer is empty")
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


# registers "code" and "code_all" (it imports REWARD_FUNCTIONS from here, so it comes last)
from sparrow.data import code_reward as _code_reward  # noqa: E402,F401
