"""Online schedule control: from per-bin p5 history, decide which bins to raise or lower, and
build the new schedule from a re-measurement. Pure logic: no storage, no orchestrator.

    control = ControlSettings(target=0.86, tolerance=0.01, patience=2, margin=0.05)
    decision = decide(history, step=7, schedule=s, settings=control, lowering_due=False)
    decision.raise_bins, decision.lower_bins
    new, changes = apply_measurement(s, decision, topk_pages, p5_table, control)

`history` maps step -> {bin: p5} (bin_stats of a run); bins past the schedule's last count as
the last (the lowest p5 of them). A bin crosses below when its p5 is
under target - tolerance at each of the last `patience` steps with statistics for it, the
current one included. When lowering is due (the caller's timer), a bin whose p5 at this step
is at least target + margin is a candidate to lower. The caller then re-measures those bins
exactly, teacher-forced on the step's own trajectories, at the budgets of the grid above
(raise) or below (lower) the bin's current top-k (only those grid_search.py needs), and
`apply_measurement` takes per bin the smallest measured budget meeting the target: for a raise
the smallest larger one (the largest measured when none does), for a lower the smallest
smaller one (none: the bin stays). The
result is made non-decreasing over bins: a raised bin lifts the bins after it, a lowered bin
stops at the bin before it, unless that bin held no generated token in the re-measured
trajectories (only prompts reach it), which then follows it down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from sparrow_core.errors import SparrowError
from sparrow_core.sparse.schedule import Schedule


class ControllerError(SparrowError, ValueError):
    """Bad controller settings or measurements (named in the message)."""


@dataclass(frozen=True)
class ControlSettings:
    target: float = 0.86
    # below means p5 < target - tolerance
    tolerance: float = 0.0
    # steps in a row below before a raise
    patience: int = 1
    # lowering candidates have p5 >= target + margin
    margin: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.target <= 1.0:
            raise ControllerError(f"target must be in (0, 1], got {self.target}")
        if not 0.0 <= self.tolerance < 1.0 or not 0.0 <= self.margin < 1.0:
            raise ControllerError(f"tolerance and margin must be in [0, 1), got "
                                  f"{self.tolerance}, {self.margin}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) \
                or self.patience < 1:
            raise ControllerError(f"patience must be an integer >= 1, got {self.patience!r}")


@dataclass(frozen=True)
class Decision:
    """Bins to re-measure at larger budgets (raise) and at smaller ones (lower), and why."""

    step: int
    raise_bins: tuple[int, ...] = ()
    lower_bins: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if set(self.raise_bins) & set(self.lower_bins):
            raise ControllerError("a bin cannot be raised and lowered at one step")

    @property
    def any(self) -> bool:
        return bool(self.raise_bins or self.lower_bins)


@dataclass(frozen=True)
class Change:
    """One bin's budget before and after, with the p5 measured at the new budget."""

    bin: int
    kind: str  # raise | lower | follow (moved to keep the schedule non-decreasing)
    old_topk: int
    new_topk: int
    p5: float


def decide(history: Mapping[int, Mapping[int, float]], step: int, schedule: Schedule,
           settings: ControlSettings, lowering_due: bool = False) -> Decision:
    """Which bins of `schedule` to re-measure after `step` (see the module doc)."""
    if step not in history:
        return Decision(step)
    history = {s: _clamped(bins, schedule.num_bins) for s, bins in history.items()}
    floor = settings.target - settings.tolerance
    raise_bins, reasons = [], []
    for b, p5 in sorted(history[step].items()):
        seen = [history[s][b] for s in sorted(history) if s <= step and b in history[s]]
        recent = seen[-settings.patience:]
        if len(recent) == settings.patience and all(v < floor for v in recent):
            raise_bins.append(b)
            reasons.append(f"bin {b}: p5 {p5:.4f} < {floor:.4f} for {settings.patience} step(s)")
    lower_bins = []
    if lowering_due:
        for b, p5 in sorted(history[step].items()):
            topk = schedule.topk_pages[b]
            if b not in raise_bins and p5 >= settings.target + settings.margin and topk > 1:
                lower_bins.append(b)
                reasons.append(f"bin {b}: p5 {p5:.4f} >= target + margin "
                               f"{settings.target + settings.margin:.4f}; try fewer pages")
    return Decision(step, tuple(raise_bins), tuple(lower_bins), tuple(reasons))


def _clamped(bins: Mapping[int, float], num_bins: int) -> dict[int, float]:
    """Positions past the last bin read the last bin's budget: their p5 counts there (the lowest)."""
    out: dict[int, float] = {}
    for b, p5 in bins.items():
        key = min(int(b), num_bins - 1)
        out[key] = min(out.get(key, math.inf), float(p5))
    return out


def candidate_topk_pages(schedule: Schedule, bin_: int, grid: Sequence[int], kind: str) -> list[int]:
    """Grid budgets above (raise) or below (lower) the bin's current top-k."""
    current = schedule.topk_pages[min(bin_, schedule.num_bins - 1)]
    if kind == "raise":
        return [b for b in grid if b > current]
    if kind == "lower":
        return [b for b in grid if b < current]
    raise ControllerError(f"kind must be raise or lower, got {kind!r}")


def _pick(topk_pages: Sequence[int], p5: np.ndarray, bin_: int, current: int, target: float,
          kind: str) -> tuple[int, float] | None:
    side = (lambda b: b > current) if kind == "raise" else (lambda b: b < current)
    measured = [(b, float(p5[j, bin_])) for j, b in enumerate(topk_pages)
                if side(b) and not math.isnan(p5[j, bin_])]
    meeting = [(b, v) for b, v in measured if v >= target]
    if meeting:
        return min(meeting)
    if kind == "raise" and measured:
        return max(measured)
    return None


def apply_measurement(schedule: Schedule, decision: Decision, topk_pages: Sequence[int], p5,
                      settings: ControlSettings,
                      tokens: Sequence[int] | None = None) -> tuple[Schedule, list[Change]]:
    """The new schedule from p5[budget, bin] re-measured at `budgets`, and what changed.

    tokens: generated tokens per bin in the re-measured trajectories; a bin with none (a bin
    only prompts reach) follows a lowered bin after it down instead of blocking it.
    """
    p5 = np.asarray(p5, dtype=np.float64)
    if p5.ndim != 2 or p5.shape[0] != len(topk_pages):
        raise ControllerError(f"p5 must be [topk_pages={len(topk_pages)}, bins], got {p5.shape}")
    width = schedule.num_bins
    if any(not 0 <= b < width for b in decision.raise_bins + decision.lower_bins):
        raise ControllerError(f"decision names bins outside the schedule's {width}")
    topk = list(schedule.topk_pages)
    old, kinds, measured = list(topk), {}, {}
    for kind, bins in (("raise", decision.raise_bins), ("lower", decision.lower_bins)):
        for b in bins:
            picked = None
            if b < p5.shape[1]:
                picked = _pick(topk_pages, p5, b, topk[b], settings.target, kind)
            if picked is not None:
                topk[b], kinds[b], measured[b] = picked[0], kind, picked[1]
    empty = [tokens is not None and (b >= len(tokens) or tokens[b] == 0) for b in range(width)]
    for b in range(width - 2, -1, -1):
        if empty[b] and topk[b] > topk[b + 1] and kinds.get(b + 1) in ("lower", "follow"):
            topk[b], kinds[b] = topk[b + 1], "follow"
    for b in range(1, width):  # non-decreasing: raises lift later bins, lowers stop at earlier
        if topk[b] < topk[b - 1]:
            topk[b] = topk[b - 1]
            kinds.setdefault(b, "follow")
    changes = [Change(b, kinds.get(b, "follow"), old[b], topk[b], measured.get(b, math.nan))
               for b in range(width) if topk[b] != old[b]]
    return replace(schedule, topk_pages=tuple(topk)), changes
