"""DAPO's dynamic sampling: keep the prompt groups whose rewards differ, draw more until full.

    from sparrow.rl.dynamic_sampling import fill_batch
    filled = fill_batch(draw, groups_needed=8, max_draws=4)
    # draw(d) -> per group of draw d, its samples' rewards; called for d = 0, 1, ... as needed
    filled.kept           # [(draw, group), ...]: the batch, informative groups first
    filled.draws, filled.informative, filled.filled

A group whose samples all got the same reward has GRPO advantage 0 for every sample: it
costs a long-context update and teaches nothing (DAPO, Yu et al. 2025, section 3.2). Draws
are taken one at a time; each draw's informative groups join the batch in order until it
holds groups_needed; after max_draws draws a batch still short is filled with the
uninformative groups seen, in draw order (so the batch keeps its size and the trainer sees
the same shapes; they add no gradient). DAPO's reference code raises instead once its cap is
hit; a run here goes on and reports the shortfall (`filled`).
Test: tests/rl/test_dynamic_sampling.py (against a plain loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparrow.rl.checks import RLInputError


@dataclass(frozen=True)
class FilledBatch:
    kept: list[tuple[int, int]]  # (draw, group within the draw), informative groups first
    draws: int  # draws taken
    groups_drawn: int  # groups seen over all draws
    informative: int  # informative groups in `kept`
    filled: int  # uninformative groups added because the draws ran out

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic/draws": float(self.draws),
            "dynamic/groups_drawn": float(self.groups_drawn),
            "dynamic/informative_frac": self.informative / max(len(self.kept), 1),
            "dynamic/filled_groups": float(self.filled),
        }


def informative(rewards: Sequence[float]) -> bool:
    """True when the group's rewards are not all equal (its GRPO advantages are not all 0)."""
    return len(rewards) > 0 and max(rewards) != min(rewards)


def fill_batch(
    draw: Callable[[int], Sequence[Sequence[float]]], groups_needed: int, max_draws: int
) -> FilledBatch:
    """The groups of at most max_draws draws that make the batch (see the module doc)."""
    if groups_needed < 1 or max_draws < 1:
        raise RLInputError(
            f"groups_needed and max_draws must be >= 1, got {groups_needed} and {max_draws}"
        )
    kept: list[tuple[int, int]] = []
    spare: list[tuple[int, int]] = []
    drawn = draws = 0
    while draws < max_draws and len(kept) < groups_needed:
        groups = draw(draws)
        for index, rewards in enumerate(groups):
            wanted = informative(rewards) and len(kept) < groups_needed
            (kept if wanted else spare).append((draws, index))
        drawn += len(groups)
        draws += 1
    informative_count = len(kept)
    filler = spare[: max(groups_needed - len(kept), 0)]
    return FilledBatch(kept + filler, draws, drawn, informative_count, len(filler))
