"""Top-k grid search for the online controller: measure only the grid budgets needed to find, per
bin, the budget that measuring every candidate would pick. Pure logic: `measure` is passed in.

    topk_pages, p5 = search_topk_pages(schedule, decision, grid, measure, target=0.86)
    new, changes = apply_measurement(schedule, decision, topk_pages, p5, settings)

`measure(topk_pages)` returns the statistic (oriented, higher is better) as
[len(topk_pages), bins]; each call is one teacher-forced replay of the trajectories at those budgets. Per bin the
candidates are controller.candidate_topk_pages (above the current top-k for a raise, below it for
a lower), and the budget wanted is the smallest candidate meeting the target. Assuming the
statistic is non-decreasing in the budget, this is a lower-bound search over the sorted
candidates that gallops from the end where the answer usually is - a raise from the next notch
up (indices 0, 2, 6, 14, ...), a lower from the notch just below the current one (n-1, n-3,
n-7, ...) - then bisects between the last failing and the first meeting probe. It ends with
both the picked budget (meeting) and the candidate just below it (failing) measured, and for a
raise with nothing meeting, the largest candidate measured; so apply_measurement's pick on the
measured budgets is the exhaustive one. All bins' probes of a round share one replay (a round
costs one dense forward besides the sparse ones); a probe measured for one bin counts for every
bin. A bin with no token (NaN) stops at its first probe and stays, as it would.
If the statistic is not monotone the search can miss a smaller meeting budget between probes:
the pick is then a measured budget that meets the target and is never smaller than the
exhaustive pick (a raise with no meeting probe takes the largest candidate, a lower with none
keeps the bin), so it errs on the side of more pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sparrow.control.controller import Decision, candidate_topk_pages
from sparrow.sparse.schedule import Schedule

Measure = Callable[[list[int]], np.ndarray]


class _Search:
    """Lower bound over sorted candidates: indices < lo fail, indices >= hi meet."""

    def __init__(self, bin_: int, candidates: list[int], from_top: bool) -> None:
        self.bin, self.candidates, self.from_top = bin_, candidates, from_top
        self.lo, self.hi, self.empty = 0, len(candidates), False

    @property
    def done(self) -> bool:
        return self.empty or self.lo >= self.hi

    def probe(self) -> int:
        n = len(self.candidates)
        if not self.from_top and self.hi == n:  # nothing meets yet: gallop up
            index = min(n - 1, 2 * self.lo)
        elif self.from_top and self.lo == 0:  # nothing fails yet: gallop down
            index = max(0, self.hi - 1 - (n - self.hi))
        else:
            index = (self.lo + self.hi) // 2
        return self.candidates[index]

    def update(self, candidate: int, value: float, target: float) -> None:
        if math.isnan(value):
            self.empty = True
        elif value >= target:
            self.hi = self.candidates.index(candidate)
        else:
            self.lo = self.candidates.index(candidate) + 1


def search_topk_pages(
    schedule: Schedule,
    decision: Decision,
    grid: Sequence[int],
    measure: Measure,
    target: float,
    known: Mapping[int, np.ndarray] | None = None,
) -> tuple[list[int], np.ndarray]:
    """(the top-k pages measured, sorted; statistic[topk index, bin]) for apply_measurement
    (module doc). known: rows already measured this step (top-k -> statistic per bin, e.g. a
    raise's confirmation at the current budgets), used as probes and returned with the rest."""
    searches = [
        _Search(b, candidate_topk_pages(schedule, b, grid, kind), kind == "lower")
        for kind, bins in (("raise", decision.raise_bins), ("lower", decision.lower_bins))
        for b in bins
    ]
    rows = {int(b): np.asarray(row, dtype=np.float64) for b, row in (known or {}).items()}
    while True:
        wanted = set()
        for search in searches:
            while not search.done and search.probe() in rows:  # measured for another bin
                candidate = search.probe()
                search.update(candidate, _value(rows[candidate], search.bin), target)
            if not search.done:
                wanted.add(search.probe())
        if not wanted:
            break
        batch = sorted(wanted)
        table = np.asarray(measure(batch), dtype=np.float64)
        for candidate, row in zip(batch, table):
            rows[candidate] = row
    topk_pages = sorted(rows)
    width = max((rows[b].size for b in topk_pages), default=schedule.num_bins)
    return topk_pages, np.array([rows[b] for b in topk_pages]).reshape(len(topk_pages), width)


def _value(row: np.ndarray, bin_: int) -> float:
    return float(row[bin_]) if bin_ < row.size else math.nan
