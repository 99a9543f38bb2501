"""Choosing a schedule from a calibration table: per bin the cheapest budget meeting the target.

    from sparrow.control.choose import choose_topk_pages, topk_cost_table
    cost = topk_cost_table(topk_pages, num_bins, template, model=shape, hardware=hw, prompt_len=40)
    choice = choose_topk_pages(topk_pages, p5, counts, cost, target=0.86, min_tokens=200)
    choice.topk_pages, choice.notes()

Inputs are a grid of top-k page budgets (strictly increasing), the p5 of acceptance per
(budget, bin) (NaN where nothing was measured), the tokens per bin, and a cost per (budget,
bin) (eFLOPs from the cost model). A bin is *measured* when it holds at least `min_tokens`
tokens; an under-populated bin takes the constraint of the nearest measured bin (the previous
one when there is one, else the next) and its note says so. A measured bin where no budget
of the grid meets the target gets the largest budget, and says so. A budget meets the target
in a bin when it or a smaller budget measured p5 >= target (more pages never move the actor
away from dense; a dip at a larger budget is sampling noise), so the largest budget is always
allowed and a schedule always exists. Among all schedules that
are non-decreasing over bins and meet every bin's constraint, the one of least total cost is
returned (dynamic programming over bins, exact; tests hold it to a brute-force search).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparrow.costmodel.presets import Hardware, ModelShape
from sparrow.costmodel.segments import segment_cost
from sparrow.errors import SparrowError
from sparrow.sparse.schedule import Schedule


class ChooseError(SparrowError, ValueError):
    """A calibration table the chooser cannot use (the message names what is wrong)."""


@dataclass(frozen=True)
class BinChoice:
    """The decision for one bin: its top-k pages, the p5 measured there, and why."""

    bin: int
    topk_pages: int
    tokens: int
    # p5 at the chosen budget; NaN when the bin was not measured there
    p5: float
    # "" for a measured bin that met the target; otherwise a sentence saying what happened
    note: str = ""

    def __post_init__(self) -> None:
        if self.bin < 0 or self.topk_pages < 1 or self.tokens < 0:
            raise ChooseError(
                f"bin choice needs bin >= 0, topk_pages >= 1, tokens >= 0; got "
                f"{self.bin}, {self.topk_pages}, {self.tokens}"
            )


@dataclass(frozen=True)
class Choice:
    """A chosen schedule's top-k per bin, per-bin decisions and its total cost."""

    topk_pages: tuple[int, ...]
    bins: tuple[BinChoice, ...]
    cost: float

    def __post_init__(self) -> None:
        if list(self.topk_pages) != sorted(self.topk_pages):
            raise ChooseError(f"a chosen schedule must be non-decreasing, got {self.topk_pages}")

    def notes(self) -> list[str]:
        return [f"bin {b.bin}: {b.note}" for b in self.bins if b.note]


def _as_table(name: str, values, shape: tuple[int, int]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != shape:
        raise ChooseError(f"{name} must have shape (topk_pages, bins) = {shape}, got {array.shape}")
    return array


def _check_grid(topk_pages: Sequence[int]) -> list[int]:
    grid = [int(b) for b in topk_pages]
    if not grid or any(b < 1 for b in grid) or any(b >= c for b, c in zip(grid, grid[1:])):
        raise ChooseError(
            f"topk_pages must be positive and strictly increasing, got {list(topk_pages)}"
        )
    return grid


def _constraints(
    p5: np.ndarray, tokens: np.ndarray, target: float, min_tokens: int
) -> tuple[np.ndarray, list[str]]:
    """allowed[topk index, bin] and a note per bin (see the module doc)."""
    num_bins = p5.shape[1]
    measured = [i for i in range(num_bins) if tokens[i] >= min_tokens]
    if not measured:
        raise ChooseError(
            f"no bin holds min_tokens={min_tokens} tokens (most: "
            f"{int(tokens.max()) if tokens.size else 0}); calibrate on more "
            "prompts or repeats, or lower min_tokens"
        )
    # more pages never take the actor further from dense; a dip in measured p5 at a larger
    # budget is sampling noise, so a budget meets the target once a smaller one has
    own = np.logical_or.accumulate(np.nan_to_num(p5, nan=-1.0) >= target, axis=0)
    notes = [""] * num_bins
    for i in measured:
        if not own[:, i].any():
            own[:, i] = False
            own[-1, i] = True
            notes[i] = f"no budget of the grid reaches p5 {target}; takes the largest"
    allowed = np.zeros_like(own)
    for i in range(num_bins):
        if i in measured:
            allowed[:, i] = own[:, i]
            continue
        before = [m for m in measured if m < i]
        source = before[-1] if before else min(measured)
        allowed[:, i] = own[:, source]
        notes[i] = (
            f"{int(tokens[i])} tokens (< min_tokens {min_tokens}); takes bin {source}'s decision"
        )
    return allowed, notes


def choose_topk_pages(
    topk_pages: Sequence[int], p5, tokens, cost, target: float, min_tokens: int = 1
) -> Choice:
    """The cheapest non-decreasing schedule over the grid that meets every bin's constraint."""
    grid = _check_grid(topk_pages)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    shape = (len(grid), tokens.size)
    p5, cost = _as_table("p5", p5, shape), _as_table("cost", cost, shape)
    if not 0.0 < target <= 1.0:
        raise ChooseError(f"target must be in (0, 1], got {target}")
    if not np.isfinite(cost).all() or (cost < 0).any():
        raise ChooseError("cost must be finite and >= 0 everywhere")
    allowed, notes = _constraints(p5, tokens, target, min_tokens)
    grid_size, num_bins = shape
    best = np.where(allowed[:, 0], cost[:, 0], np.inf)
    back = np.zeros(shape, dtype=np.int64)
    for i in range(1, num_bins):
        # the cheapest way to reach bin i-1 with a budget no larger than j
        arg = np.zeros(grid_size, dtype=np.int64)
        for j in range(1, grid_size):
            arg[j] = j if best[j] < best[arg[j - 1]] else arg[j - 1]
        back[:, i] = arg
        best = np.where(allowed[:, i], cost[:, i] + best[arg], np.inf)
    picks = [int(np.argmin(best))]
    for i in range(num_bins - 1, 0, -1):
        picks.append(int(back[picks[-1], i]))
    picks.reverse()
    bins = tuple(
        BinChoice(
            bin=i, topk_pages=grid[j], tokens=int(tokens[i]), p5=float(p5[j, i]), note=notes[i]
        )
        for i, j in enumerate(picks)
    )
    total = float(sum(cost[j, i] for i, j in enumerate(picks)))
    return Choice(tuple(grid[j] for j in picks), bins, total)


def topk_cost_table(
    topk_pages: Sequence[int],
    num_bins: int,
    template: Schedule,
    *,
    model: ModelShape,
    hardware: Hardware,
    prompt_len: int,
    variant: str = "paper",
) -> np.ndarray:
    """eFLOPs of decoding each bin's generated tokens under each top-k, [topk_pages, bins].

    One sample after a `prompt_len` prompt; bin i holds total positions [i W, (i + 1) W) (the
    last bin too, so that it is priced like the others); pages read are top-k plus the
    template's reserved pages, times its page size.
    """
    grid = _check_grid(topk_pages)
    if num_bins < 1:
        raise ChooseError(f"num_bins must be >= 1, got {num_bins}")
    width = template.bin_tokens
    table = np.zeros((len(grid), num_bins))
    for i in range(num_bins):
        start, end = max(0, i * width - prompt_len), max(0, (i + 1) * width - prompt_len)
        if end <= start:
            continue
        for j, topk in enumerate(grid):
            budget_tokens = template.pages_for_topk(topk) * template.page_size
            table[j, i] = segment_cost(
                model=model,
                hardware=hardware,
                prompt_len=prompt_len,
                start=start,
                end=end,
                samples=1,
                budget_tokens=budget_tokens,
                page_size=template.page_size,
                variant=variant,
            ).total
    if not math.isfinite(float(table.sum())):
        raise ChooseError("the cost model gave a non-finite cost")
    return table
