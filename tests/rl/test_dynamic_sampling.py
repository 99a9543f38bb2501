"""Dynamic sampling against a plain loop: which groups make the batch, how many draws.

python -m pytest tests/rl/test_dynamic_sampling.py -q
"""

from __future__ import annotations

import random

import pytest

from sparrow.rl.checks import RLInputError
from sparrow.rl.dynamic_sampling import fill_batch, informative


def reference(draws: list[list[list[float]]], needed: int, max_draws: int):
    """Take every draw up to the cap, stopping once enough groups differ; then fill."""
    good, rest, used = [], [], 0
    for d in range(max_draws):
        if len(good) >= needed:
            break
        used += 1
        for g, rewards in enumerate(draws[d]):
            if len(set(rewards)) > 1 and len(good) < needed:
                good.append((d, g))
            else:
                rest.append((d, g))
    while len(good) < needed and rest:
        good.append(rest.pop(0))
    return good, used


@pytest.mark.parametrize("seed", range(20))
def test_fill_batch_matches_a_plain_loop(seed):
    rng = random.Random(seed)
    groups, size, needed, max_draws = rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 8), 5
    draws = [
        [[float(rng.random() < 0.3) for _ in range(size)] for _ in range(groups)]
        for _ in range(max_draws)
    ]
    calls = []

    def draw(d):
        calls.append(d)
        return draws[d]

    filled = fill_batch(draw, needed, max_draws)
    kept, used = reference(draws, needed, max_draws)
    assert filled.kept == kept
    assert calls == list(range(used)) and filled.draws == used
    assert filled.informative == sum(informative(draws[d][g]) for d, g in kept)
    assert filled.filled == len(kept) - filled.informative
    assert len(filled.kept) == min(needed, groups * used)


def test_a_worked_case():
    draws = [[[1, 1], [0, 1], [0, 0]], [[1, 0], [1, 1]], [[0, 1]]]
    filled = fill_batch(lambda d: draws[d], groups_needed=3, max_draws=4)
    assert filled.kept == [(0, 1), (1, 0), (2, 0)]
    assert (filled.draws, filled.groups_drawn, filled.filled) == (3, 6, 0)
    capped = fill_batch(lambda d: draws[d], groups_needed=3, max_draws=1)
    assert capped.kept == [(0, 1), (0, 0), (0, 2)]  # one draw allowed: filled in draw order
    assert capped.metrics()["dynamic/filled_groups"] == 2.0


def test_bad_arguments():
    with pytest.raises(RLInputError, match="must be >= 1"):
        fill_batch(lambda d: [], 0, 1)
    assert not informative([]) and not informative([0.5, 0.5]) and informative([0, 1])
