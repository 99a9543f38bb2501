"""Choosing a schedule from a calibration table: per bin the cheapest budget meeting the target.

    from sparrow.control.choose import choose_topk_pages, topk_cost_table
    cost = topk_cost_table(topk_pages, num_bins, template, model=shape, hardware=hw, prompt_len=40)
    choice = choose_topk_pages(topk_pages, p5, counts, cost, target=0.86, min_tokens=500,
                               lower=p5_lower_bound, samples=trajectories, min_samples=8)
    choice.topk_pages, choice.notes()

Inputs are a grid of top-k page budgets (strictly increasing), the p5 of acceptance per
(budget, bin) (NaN where nothing was measured) with its lower confidence bound (the
cluster bootstrap's; optional), the tokens and trajectories per bin, and a cost per (budget,
bin) (eFLOPs from the cost model). A bin is *measured* when it holds at least `min_tokens`
tokens and `min_samples` trajectories; an under-populated bin takes the constraint of the
nearest measured bin (the previous one when there is one, else the next) and its note says so.

Per measured bin the evidence (the lower bound where given, else p5) is fitted by isotonic
regression against the budget (`monotone_fit`, scipy's pool-adjacent-violators: more pages
do not move the actor away from dense, so a dip is noise and is pooled with its neighbours,
and one lucky pass at a small budget is pooled with the failures above it instead of
winning), and a budget meets the target when its fitted lower bound does: the smallest such
budget is the cheapest one whose lower confidence bound meets the target. A measured bin
where no budget meets it gets the largest budget, and says so, so a schedule always exists.
Among all schedules that are non-decreasing over bins and meet every bin's constraint, the
one of least total cost is returned (dynamic programming over bins, exact; tests hold it to a
brute-force search over a plainly written fit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression

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
    # the monotone fit of the evidence (lower bound, else p5) of the bin's own column at the
    # chosen budget; NaN where unmeasured
    fitted: float = math.nan

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


def monotone_fit(table) -> np.ndarray:
    """Per column (bin), the non-decreasing least-squares fit over the rows (budgets) of its
    finite entries (isotonic regression); a NaN entry takes the fit of the nearest smaller
    measured budget (NaN before the first)."""
    table = np.asarray(table, dtype=np.float64)
    fitted = np.full_like(table, np.nan)
    for i in range(table.shape[1]):
        finite = np.isfinite(table[:, i])
        if not finite.any():
            continue
        fitted[finite, i] = isotonic_regression(table[finite, i], increasing=True).x
        last = np.nan
        for j in range(table.shape[0]):
            last = fitted[j, i] if finite[j] else last
            fitted[j, i] = last
    return fitted


def _constraints(
    evidence: np.ndarray, measured: list[int], tokens: np.ndarray, target: float
) -> tuple[np.ndarray, list[str]]:
    """allowed[topk index, bin] and a note per bin (see the module doc)."""
    num_bins = evidence.shape[1]
    own = np.nan_to_num(monotone_fit(evidence), nan=-np.inf) >= target
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
        notes[i] = f"{int(tokens[i])} tokens, below the bin floor; takes bin {source}'s decision"
    return allowed, notes


def _measured(tokens: np.ndarray, samples, min_tokens: int, min_samples: int) -> list[int]:
    """Bins at or above the floor; an error naming the floor when there is none."""
    if samples is not None:
        samples = np.asarray(samples, dtype=np.int64).reshape(-1)
    measured = [
        i
        for i in range(tokens.size)
        if tokens[i] >= min_tokens and (samples is None or samples[i] >= min_samples)
    ]
    if not measured:
        raise ChooseError(
            f"no bin holds min_tokens={min_tokens} tokens and min_samples={min_samples} "
            f"trajectories (most tokens: {int(tokens.max()) if tokens.size else 0}); calibrate "
            "on more prompts or repeats, or lower calibrate.min_bin_tokens / min_bin_samples"
        )
    return measured


def choose_topk_pages(
    topk_pages: Sequence[int],
    p5,
    tokens,
    cost,
    target: float,
    min_tokens: int = 1,
    *,
    lower=None,
    samples=None,
    min_samples: int = 0,
) -> Choice:
    """The cheapest non-decreasing schedule over the grid that meets every bin's constraint;
    `lower`: the lower confidence bound of p5 per (budget, bin), read instead of p5 where
    given (module doc); `samples`: trajectories per bin, for the floor."""
    grid = _check_grid(topk_pages)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    shape = (len(grid), tokens.size)
    p5, cost = _as_table("p5", p5, shape), _as_table("cost", cost, shape)
    evidence = p5 if lower is None else _as_table("lower", lower, shape)
    if not 0.0 < target <= 1.0:
        raise ChooseError(f"target must be in (0, 1], got {target}")
    if not np.isfinite(cost).all() or (cost < 0).any():
        raise ChooseError("cost must be finite and >= 0 everywhere")
    measured = _measured(tokens, samples, min_tokens, min_samples)
    allowed, notes = _constraints(evidence, measured, tokens, target)
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
    fitted = monotone_fit(evidence)
    bins = tuple(
        BinChoice(
            bin=i,
            topk_pages=grid[j],
            tokens=int(tokens[i]),
            p5=float(p5[j, i]),
            note=notes[i],
            fitted=float(fitted[j, i]),
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
