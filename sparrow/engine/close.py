"""An early close of a generate() call: stop once enough groups of requests have finished.

    close = EarlyClose(labels=(0, 0, 1, 2), groups=2, required=frozenset({0}))
    results = engine.generate(prompts, params, close=close)
    results[i][j].finish_reason == "open"    # a sample cut at the close, with its tokens so far

A group is a set of requests (labels[i] names request i's group): a GRPO group is one request
of n samples, or, for samples resumed from a prefix, one request per sample. The call stops
after the first step at which `groups` groups have every sample finished and every `required`
group is among them; the samples still running, and requests never admitted, come back with
finish_reason "open" (OPEN) and the tokens they have. The check runs on the host's state after
each step, so a step launched ahead (overlap) is dropped and the results do not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparrow.engine.scheduler import SequenceGroup


def groups_to_close(fraction: float, groups: int) -> int:
    """ceil(fraction * groups), at least 1, without float noise (0.3 * 10 is 3, not 4)."""
    return max(1, min(groups, math.ceil(round(fraction * groups, 9))))


@dataclass(frozen=True)
class EarlyClose:
    labels: tuple[int, ...]  # per request of the call: its group
    groups: int  # finished groups that close the call
    required: frozenset[int] = field(default_factory=frozenset)  # groups that must finish first

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"an early close needs at least 1 group, got {self.groups}")
        missing = self.required - set(self.labels)
        if missing:
            raise ValueError(f"required groups {sorted(missing)} have no request")

    def reached(self, requests: Sequence[SequenceGroup]) -> bool:
        """Whether the call may stop now, given its requests in the labels' order."""
        if len(requests) != len(self.labels):
            raise ValueError(f"{len(self.labels)} labels for {len(requests)} requests")
        done: dict[int, bool] = {}
        for label, request in zip(self.labels, requests):
            finished = all(s.finish_reason is not None for s in request.samples)
            done[label] = done.get(label, True) and finished
        if not all(done[label] for label in self.required):
            return False
        return sum(done.values()) >= self.groups
