"""One registry helper for every pluggable choice (losses, advantages, rewards, policies).

LOSSES = Registry("policy loss")

@LOSSES.register("ppo_clip")
def ppo_clip(...): ...

LOSSES.get("ppo_clip")      # the function
LOSSES.get("nope")          # KeyError naming every valid choice
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map that refuses duplicates and lists valid names on a miss."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> T:
        """Remove and return an entry (for plugins that replace one, and for tests)."""
        if name not in self._entries:
            raise KeyError(f"{self.kind} {name!r} is not registered")
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
