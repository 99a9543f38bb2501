"""A structural check of a class against a typing.Protocol: every member is there, a method
takes the protocol's parameters under the same names (extra ones only with defaults), and a
capability (a property of the protocol) reads as a bool on the class itself, so the runtime
can ask it before building an instance."""

from __future__ import annotations

import inspect


def protocol_members(protocol: type) -> dict[str, object]:
    return {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") and name not in {"mro"}
    }


def mismatches(cls: type, protocol: type, capabilities: tuple[str, ...] = ()) -> list[str]:
    """What keeps `cls` from satisfying `protocol`; empty when it does."""
    bad = []
    for name, member in protocol_members(protocol).items():
        if not hasattr(cls, name):
            if not isinstance(member, property):  # an attribute set in __init__ is checked live
                bad.append(f"{cls.__name__} lacks {name}")
            continue
        if name in capabilities and not isinstance(getattr(cls, name), bool):
            bad.append(f"{cls.__name__}.{name} is not a bool on the class")
        function = member.__func__ if isinstance(member, classmethod) else member
        if not inspect.isfunction(function):
            continue
        want = list(inspect.signature(function).parameters.values())
        got = list(inspect.signature(getattr(cls, name)).parameters.values())
        want = want[1:]  # self or cls; a classmethod read off the class is bound already
        if not isinstance(member, classmethod):
            got = got[1:]
        names = [p.name for p in got[: len(want)]]
        if names != [p.name for p in want]:
            bad.append(
                f"{cls.__name__}.{name} takes {names}, the protocol {[p.name for p in want]}"
            )
        extra = [p.name for p in got[len(want) :] if p.default is inspect.Parameter.empty]
        if extra and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in got):
            bad.append(f"{cls.__name__}.{name} requires {extra} beyond the protocol")
    return bad
