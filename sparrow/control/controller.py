"""Online schedule control: from per-bin p5 history, decide which bins to raise or lower, and
build the new schedule from a re-measurement. Pure logic: no storage, no orchestrator.

    control = ControlSettings(target=0.86, tolerance=0.01, patience=2, margin=0.05)
    decision = decide(history, step=7, schedule=s, settings=control, lowering_due=False)
    decision.raise_bins, decision.lower_bins
    decision = confirm_raises(decision, s, exact_at_current_topk, control.target)  # optional
    new, changes = apply_measurement(s, decision, topk_pages, p5_table, control)

`history` maps step -> {bin: p5} (bin_stats of a run); bins past the schedule's last count as
the last (the lowest p5 of them). A bin crosses below when its p5 is
under target - tolerance at each of the last `patience` steps with statistics for it, the
current one included. When lowering is due (the caller's timer), a bin whose p5 at this step
is at least target + margin is a candidate to lower. The caller then re-measures those bins
exactly, teacher-forced on the step's own trajectories (a raise first at the bin's current
budget, when confirming: `confirm_raises` drops a raise the exact value there does not need),
at the budgets of the grid above
(raise) or below (lower) the bin's current top-k (only those grid_search.py needs), and
`apply_measurement` takes per bin the smallest measured budget meeting the target: for a raise
the smallest larger one (the largest measured when none does), for a lower the smallest
smaller one (none: the bin stays). The
result is made non-decreasing over bins: a raised bin lifts the bins after it, a lowered bin
stops at the bin before it, unless that bin held no generated token in the re-measured
trajectories (only prompts reach it), which then follows it down.

DistillSparse (docs/method.md): `one_notch_cheaper` lowers every bin one grid
budget; the distill stage measures the sparse actor with its LoRA under it (CheaperMeasurement)
and `distill_switch` allows the switch once the last `patience` measurements, all taken while
rolling out the schedule in force, held every measured bin at target + margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sparrow.errors import SparrowError
from sparrow.sparse.schedule import Schedule


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
            raise ControllerError(
                f"tolerance and margin must be in [0, 1), got {self.tolerance}, {self.margin}"
            )
        if (
            isinstance(self.patience, bool)
            or not isinstance(self.patience, int)
            or self.patience < 1
        ):
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
    # raise | lower | follow (moved to keep the schedule non-decreasing) | distill (a switch
    # to the cheaper schedule the LoRA holds)
    kind: str
    old_topk: int
    new_topk: int
    p5: float


def decide(
    history: Mapping[int, Mapping[int, float]],
    step: int,
    schedule: Schedule,
    settings: ControlSettings,
    lowering_due: bool = False,
) -> Decision:
    """Which bins of `schedule` to re-measure after `step` (see the module doc)."""
    if step not in history:
        return Decision(step)
    history = {s: _clamped(bins, schedule.num_bins) for s, bins in history.items()}
    floor = settings.target - settings.tolerance
    raise_bins, reasons = [], []
    for b, p5 in sorted(history[step].items()):
        seen = [history[s][b] for s in sorted(history) if s <= step and b in history[s]]
        recent = seen[-settings.patience :]
        if len(recent) == settings.patience and all(v < floor for v in recent):
            raise_bins.append(b)
            reasons.append(f"bin {b}: p5 {p5:.4f} < {floor:.4f} for {settings.patience} step(s)")
    lower_bins = []
    if lowering_due:
        for b, p5 in sorted(history[step].items()):
            topk_pages = schedule.topk_pages[b]
            if b not in raise_bins and p5 >= settings.target + settings.margin and topk_pages > 1:
                lower_bins.append(b)
                reasons.append(
                    f"bin {b}: p5 {p5:.4f} >= target + margin "
                    f"{settings.target + settings.margin:.4f}; try fewer pages"
                )
    return Decision(step, tuple(raise_bins), tuple(lower_bins), tuple(reasons))


def confirm_raises(
    decision: Decision, schedule: Schedule, current: Mapping[int, float], target: float
) -> Decision:
    """The decision less the raises that an exact re-measurement at each bin's current budget
    does not confirm. current: bin -> the statistic (oriented) measured at the bin's current
    top-k; a bin at or above `target` there, or with no token measured (NaN, or missing), keeps
    its budget, and the reasons say so. The trigger reads the top-k lower bound of
    acceptance, which a broad next-token distribution holds low at any budget."""
    kept, reasons = [], list(decision.reasons)
    for b in decision.raise_bins:
        value = float(current.get(b, math.nan))
        topk = schedule.topk_pages[min(b, schedule.num_bins - 1)]
        if math.isnan(value):
            reasons.append(f"bin {b}: no token re-measured at {topk} pages; no raise")
        elif value >= target:
            reasons.append(
                f"bin {b}: exact {value:.4f} >= {target:.4f} at its {topk} pages; no raise"
            )
        else:
            kept.append(b)
    return replace(decision, raise_bins=tuple(kept), reasons=tuple(reasons))


def _clamped(bins: Mapping[int, float], num_bins: int) -> dict[int, float]:
    """Positions past the last bin read the last bin's budget: their p5 counts there (the lowest)."""
    out: dict[int, float] = {}
    for b, p5 in bins.items():
        key = min(int(b), num_bins - 1)
        out[key] = min(out.get(key, math.inf), float(p5))
    return out


def candidate_topk_pages(
    schedule: Schedule, bin_: int, grid: Sequence[int], kind: str
) -> list[int]:
    """Grid values above (raise) or below (lower) the bin's current top-k pages."""
    current = schedule.topk_pages[min(bin_, schedule.num_bins - 1)]
    if kind == "raise":
        return [g for g in grid if g > current]
    if kind == "lower":
        return [g for g in grid if g < current]
    raise ControllerError(f"kind must be raise or lower, got {kind!r}")


def _pick(
    topk_pages: Sequence[int], p5: np.ndarray, bin_: int, current: int, target: float, kind: str
) -> tuple[int, float] | None:
    side = (lambda b: b > current) if kind == "raise" else (lambda b: b < current)
    measured = [
        (b, float(p5[j, bin_]))
        for j, b in enumerate(topk_pages)
        if side(b) and not math.isnan(p5[j, bin_])
    ]
    meeting = [(b, v) for b, v in measured if v >= target]
    if meeting:
        return min(meeting)
    if kind == "raise" and measured:
        return max(measured)
    return None


def apply_measurement(
    schedule: Schedule,
    decision: Decision,
    topk_pages: Sequence[int],
    p5,
    settings: ControlSettings,
    tokens: Sequence[int] | None = None,
) -> tuple[Schedule, list[Change]]:
    """The new schedule from p5[topk index, bin] re-measured at the grid values `topk_pages`,
    and what changed.

    tokens: generated tokens per bin in the re-measured trajectories; a bin with none (a bin
    only prompts reach) follows a lowered bin after it down instead of blocking it.
    """
    p5 = np.asarray(p5, dtype=np.float64)
    if p5.ndim != 2 or p5.shape[0] != len(topk_pages):
        raise ControllerError(f"p5 must be [topk_pages={len(topk_pages)}, bins], got {p5.shape}")
    width = schedule.num_bins
    if any(not 0 <= b < width for b in decision.raise_bins + decision.lower_bins):
        raise ControllerError(f"decision names bins outside the schedule's {width}")
    new_topk = list(schedule.topk_pages)
    old_topk, kinds, measured = list(new_topk), {}, {}
    for kind, bins in (("raise", decision.raise_bins), ("lower", decision.lower_bins)):
        for b in bins:
            picked = None
            if b < p5.shape[1]:
                picked = _pick(topk_pages, p5, b, new_topk[b], settings.target, kind)
            if picked is not None:
                new_topk[b], kinds[b], measured[b] = picked[0], kind, picked[1]
    empty = [tokens is not None and (b >= len(tokens) or tokens[b] == 0) for b in range(width)]
    for b in range(width - 2, -1, -1):
        if empty[b] and new_topk[b] > new_topk[b + 1] and kinds.get(b + 1) in ("lower", "follow"):
            new_topk[b], kinds[b] = new_topk[b + 1], "follow"
    for b in range(1, width):  # non-decreasing: raises lift later bins, lowers stop at earlier
        if new_topk[b] < new_topk[b - 1]:
            new_topk[b] = new_topk[b - 1]
            kinds.setdefault(b, "follow")
    changes = [
        Change(b, kinds.get(b, "follow"), old_topk[b], new_topk[b], measured.get(b, math.nan))
        for b in range(width)
        if new_topk[b] != old_topk[b]
    ]
    return replace(schedule, topk_pages=tuple(new_topk)), changes


# DistillSparse: switch to a cheaper schedule the LoRA holds at target


@dataclass(frozen=True)
class CheaperMeasurement:
    """One distill step's target statistic per bin (oriented: higher is better) of the sparse
    actor with its LoRA under `cheaper_topk`, on trajectories rolled out with `schedule_topk`."""

    step: int
    schedule_topk: tuple[int, ...]
    cheaper_topk: tuple[int, ...]
    values: Mapping[int, float]


def one_notch_cheaper(schedule: Schedule, grid: Sequence[int]) -> Schedule:
    """Every bin's top-k down to the largest grid budget below it (kept where none is); the
    floor is monotone, so the schedule stays non-decreasing."""
    cheaper = [
        max((g for g in grid if g < current), default=current) for current in schedule.topk_pages
    ]
    for b in range(1, len(cheaper)):
        cheaper[b] = max(cheaper[b], cheaper[b - 1])
    return replace(schedule, topk_pages=tuple(cheaper))


def distill_switch(
    measurements: Sequence[CheaperMeasurement],
    schedule: Schedule,
    settings: ControlSettings,
    patience: int,
    margin: float = 0.0,
) -> tuple[Schedule, list[Change]] | None:
    """The cheaper schedule and its changes (kind "distill", p5: the lowest measured value
    of the bin), or None: a switch needs the last `patience` measurements (by step) all of
    `schedule` and one cheaper schedule, each with a bin measured and every measured bin
    (bins past the last count in it) at target + margin or above. A bin no measurement
    reached moves with the others; the raise rule watches it from the next step on."""
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ControllerError(f"patience must be an integer >= 1, got {patience!r}")
    recent = sorted(measurements, key=lambda m: m.step)[-patience:]
    if len(recent) < patience:
        return None
    cheaper = tuple(recent[-1].cheaper_topk)
    if len(cheaper) != schedule.num_bins or cheaper == schedule.topk_pages:
        return None
    floor = settings.target + margin
    seen: dict[int, float] = {}
    for m in recent:
        values = _clamped(m.values, schedule.num_bins)
        if (
            tuple(m.schedule_topk) != schedule.topk_pages
            or tuple(m.cheaper_topk) != cheaper
            or not values
            or min(values.values()) < floor
        ):
            return None
        for b, value in values.items():
            seen[b] = min(seen.get(b, math.inf), value)
    changes = [
        Change(b, "distill", old, new, seen.get(b, math.nan))
        for b, (old, new) in enumerate(zip(schedule.topk_pages, cheaper))
        if old != new
    ]
    return replace(schedule, topk_pages=cheaper), changes
