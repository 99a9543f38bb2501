"""Which reward function `data.reward` names: a registry name, `module:function` or
`path/to/file.py:function` (verl's custom_reward_function, in one string).

    fn = load_reward("exact_match")                        # REWARD_FUNCTIONS
    fn = load_reward("my_project.rewards:json_valid")      # an importable module's function
    fn = load_reward("./rewards/json_valid.py:score")      # a file's function

Every form gives `reward(completion: str, answer: str) -> float` (docs/rewards.md). A spec that
names nothing loadable, or a function that cannot take (completion, answer), is one
RewardSpecError naming the spec and what is wrong. A file is loaded as module
`sparrow_reward_file_<hash of its path>`; the reward runner's worker processes load the spec
again themselves (`picklable_reward`), so a file's function needs no importable module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from sparrow.data.rewards import REWARD_FUNCTIONS, RewardFunction
from sparrow.errors import SparrowError


class RewardSpecError(SparrowError, ValueError):
    """data.reward names no usable reward function."""


def is_spec(name: str) -> bool:
    """True for `module:function` and `file.py:function`, False for a registry name."""
    return ":" in name


def normalise_spec(name: str) -> str:
    """The spec with a file's path made absolute (workers and resumes find the same file)."""
    if not is_spec(name):
        return name
    target, _, attr = name.rpartition(":")
    if _is_path(target):
        target = str(Path(target).expanduser().resolve())
    return f"{target}:{attr}"


def load_reward(name: str) -> RewardFunction:
    """The reward function `name` names; RewardSpecError if there is none."""
    if not is_spec(name):
        if name not in REWARD_FUNCTIONS:
            raise RewardSpecError(
                f"unknown reward function {name!r}; valid: {', '.join(REWARD_FUNCTIONS.names())},"
                f" or module:function, or path/to/file.py:function"
            )
        return REWARD_FUNCTIONS.get(name)
    target, _, attr = name.rpartition(":")
    if not target or not attr.isidentifier():
        raise RewardSpecError(
            f"reward function {name!r} is not module:function or path/to/file.py:function"
        )
    module = _load_file(target, name) if _is_path(target) else _import(target, name)
    function = getattr(module, attr, None)
    if function is None:
        raise RewardSpecError(f"reward function {name!r}: {target} has no {attr!r}")
    _check_signature(function, name)
    return function


REWARD_KEYWORDS = ("data_source", "extra_info")


def reward_keywords(function) -> frozenset[str]:
    """Which of data_source and extra_info the function takes as keyword arguments (by name,
    or all of them through **kwargs); the runner passes only those."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return frozenset(REWARD_KEYWORDS)
    usable = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.name in REWARD_KEYWORDS and p.kind in usable)


def picklable_reward(name: str) -> object:
    """What the reward runner sends its workers for a spec: unpickled there, it loads the
    function again (a file's module exists only where it was loaded)."""
    return _LoadInWorker(normalise_spec(name))


class _LoadInWorker:
    def __init__(self, spec: str):
        self.spec = spec

    def __reduce__(self):
        return load_reward, (self.spec,)


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target


def _load_file(target: str, name: str):
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise RewardSpecError(f"reward function {name!r}: no file {path}")
    module_name = "sparrow_reward_file_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before running it, as import does (dataclasses need it)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise RewardSpecError(
            f"reward function {name!r}: loading {path} raised {type(err).__name__}: {err}"
        ) from err
    return module


def _import(target: str, name: str):
    try:
        return importlib.import_module(target)
    except ImportError as err:
        raise RewardSpecError(
            f"reward function {name!r}: cannot import {target!r} ({err})"
        ) from err
    except Exception as err:
        raise RewardSpecError(
            f"reward function {name!r}: importing {target!r} raised {type(err).__name__}: {err}"
        ) from err


def _check_signature(function, name: str) -> None:
    if not callable(function):
        raise RewardSpecError(
            f"reward function {name!r} is a {type(function).__name__}, not a function"
        )
    try:
        inspect.signature(function).bind("completion", "answer")
    except TypeError:
        raise RewardSpecError(
            f"reward function {name!r} must take (completion: str, answer: str) and return a "
            f"float; its signature is {inspect.signature(function)}"
        ) from None
    except ValueError:
        pass  # a builtin without a signature: the first call will tell
