"""A calibration's acceptance table: statistics per (top-k budget, length bin), each with its
cluster-bootstrap bounds over trajectories, and the trajectories per bin for the floor.

    table = table_from_tokens(topk_pages, positions, [alpha_per_budget], bin_tokens,
                              trajectories=trajectory_id_per_token, seed=0)
    table.p5[topk_index, bin], table.bounds["p5_lo"][topk_index, bin], table.samples[bin]
    table.conservative("p5")        # the bound on the failing side, oriented: what choose reads
    table.rows(floor)               # the `calibration` rows, estimator "exact"

Percentiles are numpy's linear ones, as in mismatch.bin_statistics; the bounds are those of
sparrow/mismatch/bootstrap.py (95% percentile intervals, trajectories resampled, seeded per
(seed, budget, bin)). A table read from a file written before the bounds existed has none:
the chooser then reads the point estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparrow.errors import SparrowError
from sparrow.mismatch.acceptance import EXACT, BinFloor, bin_index
from sparrow.mismatch.bootstrap import bootstrap_intervals
from sparrow.mismatch.stats import LOW_ACCEPTANCE
from sparrow.sparse.target import get_statistic

PERCENTILES = (1, 5, 10)
# per (budget, bin) statistics of an AcceptanceTable (min and share_below_half: see target.py)
STATISTICS = ("p1", "p5", "p10", "mean", "min", "share_below_half")
# the bounds a table holds: <statistic>_lo and <statistic>_hi
BOUNDS = tuple(f"{name}_{side}" for name in STATISTICS for side in ("lo", "hi"))


class CalibrationError(SparrowError, ValueError):
    """Bad calibration input (the message names it)."""


@dataclass(frozen=True)
class AcceptanceTable:
    """Per (budget, bin) acceptance statistics of one calibration; NaN where a bin is empty."""

    topk_pages: tuple[int, ...]
    bin_tokens: int
    # generated tokens per bin (the same tokens under every budget)
    tokens: np.ndarray
    p1: np.ndarray
    p5: np.ndarray
    p10: np.ndarray
    mean: np.ndarray
    # lowest acceptance and share below 0.5; None in a table written before they existed
    min: np.ndarray | None = None
    share_below_half: np.ndarray | None = None
    # trajectories with a token in each bin (the fewest over budgets); None: not recorded
    samples: np.ndarray | None = None
    # BOUNDS name -> [budget, bin] array; empty in a table written before the bounds existed
    bounds: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = (len(self.topk_pages), self.tokens.size)
        for name, value in [*((n, getattr(self, n)) for n in STATISTICS), *self.bounds.items()]:
            if value is not None and value.shape != shape:
                raise CalibrationError(f"AcceptanceTable.{name} must have shape {shape}")
        if self.samples is not None and self.samples.shape != self.tokens.shape:
            raise CalibrationError(f"AcceptanceTable.samples must have shape {self.tokens.shape}")

    def statistic(self, name: str) -> np.ndarray:
        """The [budget, bin] table of a target statistic (schedule.target_statistic)."""
        value = getattr(self, get_statistic(name).column)
        if value is None:
            raise CalibrationError(f"this calibration table has no {name!r}; measure it again")
        return value

    def conservative(self, name: str) -> np.ndarray | None:
        """The statistic's confidence bound on its failing side (the low bound of p5, the high
        bound of share_below_half), oriented higher-is-better; None without bounds."""
        statistic = get_statistic(name)
        side = "lo" if statistic.higher_is_better else "hi"
        bound = self.bounds.get(f"{statistic.column}_{side}")
        return None if bound is None else statistic.oriented(bound)

    @property
    def num_bins(self) -> int:
        return int(self.tokens.size)

    def counted(self, floor: BinFloor | None) -> np.ndarray:
        """Per bin: holds the floor's tokens and trajectories (every bin when floor is None)."""
        samples = [None] * self.num_bins if self.samples is None else self.samples
        return np.array(
            [floor is None or floor.admits(int(n), s) for n, s in zip(self.tokens, samples)]
        )

    def rows(self, floor: BinFloor | None = None) -> list[dict[str, Any]]:
        """One plain row per (budget, bin) holding tokens (the `calibration` table's columns)."""
        counted = self.counted(floor)

        def value(array: np.ndarray | None, j: int, i: int) -> float | None:
            return None if array is None or math.isnan(array[j, i]) else float(array[j, i])

        return [
            {
                "topk_pages": b,
                "bin": i,
                "n": int(self.tokens[i]),
                **{name: value(getattr(self, name), j, i) for name in ("p1", "p5", "p10", "mean")},
                **{name: value(self.bounds.get(name), j, i) for name in BOUNDS},
                "samples": None if self.samples is None else int(self.samples[i]),
                "counted": bool(counted[i]),
                "estimator": EXACT,
            }
            for j, b in enumerate(self.topk_pages)
            for i in range(self.num_bins)
            if self.tokens[i]
        ]


def _cell(values: np.ndarray) -> dict[str, float]:
    p1, p5, p10 = np.percentile(values, PERCENTILES)
    return {
        "p1": p1,
        "p5": p5,
        "p10": p10,
        "mean": values.mean(),
        "min": values.min(),
        "share_below_half": np.count_nonzero(values < LOW_ACCEPTANCE) / values.size,
    }


def table_from_tokens(
    topk_pages: Sequence[int],
    positions: np.ndarray,
    acceptance: Sequence[np.ndarray],
    bin_tokens: int,
    num_bins: int = 0,
    bins: Sequence[int] | None = None,
    trajectories: np.ndarray | None = None,
    seed: int = 0,
) -> AcceptanceTable:
    """Per-bin statistics of per-token acceptance (one array per budget, same positions);
    trajectories: each token's trajectory id (None: no bounds, no samples)."""
    # the table widens to the last bin holding a token, so no token lies past its last bin
    token_bins = bin_index(np.asarray(positions), bin_tokens)
    width = max(int(num_bins), int(token_bins.max()) + 1)
    tokens = np.bincount(token_bins, minlength=width)
    shape = (len(topk_pages), width)
    stats = {name: np.full(shape, np.nan) for name in STATISTICS}
    bounds = {name: np.full(shape, np.nan) for name in BOUNDS} if trajectories is not None else {}
    samples = None
    if trajectories is not None:
        trajectories = np.asarray(trajectories).reshape(-1)
        samples = np.array([np.unique(trajectories[token_bins == i]).size for i in range(width)])
    wanted = range(width) if bins is None else [b for b in bins if 0 <= b < width]
    for j, alpha in enumerate(acceptance):
        for i in wanted:
            mask = token_bins == i
            if not mask.any():
                continue
            for name, v in _cell(alpha[mask]).items():
                stats[name][j, i] = v
            if trajectories is not None:
                intervals = bootstrap_intervals(alpha[mask], trajectories[mask], seed=(seed, j, i))
                for name in STATISTICS:
                    bounds[f"{name}_lo"][j, i], bounds[f"{name}_hi"][j, i] = intervals[name]
    return AcceptanceTable(
        tuple(int(b) for b in topk_pages),
        bin_tokens,
        tokens,
        **stats,
        samples=samples,
        bounds=bounds,
    )
