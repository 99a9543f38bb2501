"""Length bins and per-bin acceptance statistics: what the controller watches per step.

    from sparrow.mismatch.acceptance import bin_index, bin_statistics, min_p5, bins_below
    stats = bin_statistics(positions, acceptance, bin_tokens=2000,   # list[BinStats]
                           samples=trajectory_ids, floor=BinFloor(500, 8), seed=step)
    stats[0].intervals["p5"]             # (low, high): cluster bootstrap over trajectories
    min_p5(stats); bins_below(stats, target=0.86)   # counted bins only

Tokens are grouped by total position into bins of bin_tokens (2,000 by default); each bin
gets its count, mean, p1/p5/p10/p50 (numpy's default linear interpolation), the Beta fit
of its tail below 0.999 (sparrow/mismatch/fit.py), its minimum and the share of its
tokens below 0.5 (LOW_ACCEPTANCE; beyond the paper, for the stability study). Given each
token's trajectory (`samples`), every statistic gets a 95% cluster-bootstrap interval
(sparrow/mismatch/bootstrap.py) and the bin counts the trajectories reaching it; a bin below
the floor (fewer tokens or trajectories than BinFloor asks) is kept but not `counted`: the
worst bin, the threshold events, the controller and calibration leave it out. Part of
sparrow.mismatch.acceptance, which re-exports the public names; `sparrow mismatch stats FILE.parquet` prints these rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

from sparrow import schedule_math
from sparrow.mismatch import bootstrap
from sparrow.mismatch.fit import (
    MIN_TAIL,
    TAIL_THRESHOLD,
    BetaFit,
    MismatchError,
    check_acceptance,
    first_bad,
    fit_beta_tail,
    to_numpy,
)

BIN_TOKENS = 2000
PERCENTILES = (1, 5, 10, 50)
# BinStats.share_below_half counts tokens whose acceptance is strictly below this
LOW_ACCEPTANCE = bootstrap.LOW_ACCEPTANCE
# which acceptance estimator a statistic was computed from (bin_stats.estimator, calibration,
# threshold_events): the exact sum of min(p, q) over the vocabulary (calibration, replays)
EXACT = "exact"


def topk_bound_estimator(k: int) -> str:
    """The label of the lower bound from the actor's top-k (train steps): "top20_lower_bound"."""
    return f"top{int(k)}_lower_bound"


# length bins


def _check_bins(bin_tokens: Any, num_bins: Any) -> None:
    if (
        isinstance(bin_tokens, bool)
        or not isinstance(bin_tokens, (int, np.integer))
        or bin_tokens < 1
    ):
        raise MismatchError(f"bin_tokens must be an integer >= 1, got {bin_tokens!r}")
    if num_bins is not None and (
        isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1
    ):
        raise MismatchError(f"num_bins must be an integer >= 1 or None, got {num_bins!r}")


def _integer_positions(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in "iu":
        values = array.astype(np.int64)
    elif array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.floor(array))
        if bad.any():
            raise MismatchError(
                f"position must hold whole numbers: {first_bad(bad.ravel(), array.ravel())}"
            )
        values = array.astype(np.int64)
    else:
        raise MismatchError(f"position must be integers, got dtype {array.dtype}")
    negative = values < 0
    if negative.any():
        raise MismatchError(f"position must be >= 0: {first_bad(negative.ravel(), values.ravel())}")
    return values


def bin_index(position: Any, bin_tokens: int = BIN_TOKENS, num_bins: int | None = None) -> Any:
    """Length bin of total positions: position // bin_tokens, clamped to num_bins - 1 if given.

    Takes an int, a numpy array or a torch tensor and returns the same kind (int64 arrays);
    the checked form of sparrow.schedule_math.bin_of (Schedule.bin_of with num_bins).
    """
    _check_bins(bin_tokens, num_bins)
    if isinstance(position, torch.Tensor):
        if position.is_floating_point() or bool((position < 0).any()):  # checked, with a message
            bins = torch.from_numpy(bin_index(to_numpy(position, "position"), bin_tokens, num_bins))
            return bins.to(position.device)
        return schedule_math.bin_of(position.long(), bin_tokens, num_bins)
    array = to_numpy(position, "position")
    bins = schedule_math.bin_of(_integer_positions(array), bin_tokens, num_bins)
    return int(bins) if array.ndim == 0 and not isinstance(position, np.ndarray) else bins


# per-bin statistics (numpy)


@dataclass(frozen=True)
class BinFloor:
    """The least a bin must hold for its statistics to count (calibrate.min_bin_tokens and
    calibrate.min_bin_samples): a p5 of a few runaway trajectories is mostly noise."""

    min_tokens: int = 500
    min_samples: int = 8

    def __post_init__(self) -> None:
        if self.min_tokens < 0 or self.min_samples < 0:
            raise MismatchError(
                f"a bin floor must be >= 0, got {self.min_tokens}, {self.min_samples}"
            )

    def admits(self, tokens: int, samples: int | None) -> bool:
        """samples None: trajectories unknown, the token count alone decides."""
        return tokens >= self.min_tokens and (samples is None or samples >= self.min_samples)


@dataclass(frozen=True)
class BinStats:
    """Acceptance statistics of one length bin; beta_* and ks are NaN when the tail is too small.

    Percentiles are numpy's default (linear interpolation); tail_n counts tokens below 0.999,
    the ones the Beta fit sees; beta_var is the variance on the scaled [0, 1] axis; min is the
    lowest acceptance in the bin and share_below_half the share of its tokens below
    LOW_ACCEPTANCE (NaN when not computed: rows written before these existed). samples counts
    the trajectories with a token in the bin (0: unknown); counted is False below the floor;
    intervals maps a statistic of bootstrap.STATISTICS to its (low, high) bounds (empty:
    not computed).
    """

    bin: int
    n: int
    mean: float
    p1: float
    p5: float
    p10: float
    p50: float
    beta_a: float
    beta_b: float
    beta_var: float
    ks: float
    tail_n: int
    min: float = math.nan
    share_below_half: float = math.nan
    samples: int = 0
    counted: bool = True
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.bin < 0 or self.n < 1 or not 0 <= self.tail_n <= self.n:
            raise MismatchError(
                f"BinStats needs bin >= 0, n >= 1 and 0 <= tail_n <= n, "
                f"got bin={self.bin}, n={self.n}, tail_n={self.tail_n}"
            )
        quantiles = (self.p1, self.p5, self.p10, self.p50)
        if not all(0.0 <= v <= 1.0 for v in (self.mean, *quantiles)) or list(quantiles) != sorted(
            quantiles
        ):
            raise MismatchError(
                f"bin {self.bin}: mean and p1 <= p5 <= p10 <= p50 must lie in [0, 1], "
                f"got mean={self.mean}, percentiles={quantiles}"
            )
        if not (math.isnan(self.min) or 0.0 <= self.min <= self.p1) or not (
            math.isnan(self.share_below_half) or 0.0 <= self.share_below_half <= 1.0
        ):
            raise MismatchError(
                f"bin {self.bin}: min must lie in [0, p1] and share_below_half in [0, 1], "
                f"got min={self.min}, share_below_half={self.share_below_half}"
            )

    def as_dict(self) -> dict[str, Any]:
        """Flat: every statistic's bounds as <name>_lo and <name>_hi (NaN when not computed)."""
        row = asdict(self)
        row.pop("intervals")
        for name in bootstrap.STATISTICS:
            row[f"{name}_lo"], row[f"{name}_hi"] = self.intervals.get(name, (math.nan, math.nan))
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> BinStats:
        """The inverse of as_dict (other keys of the row are ignored)."""
        names = {f.name for f in fields(cls)} - {"intervals"}
        intervals = {
            name: (float(row[f"{name}_lo"]), float(row[f"{name}_hi"]))
            for name in bootstrap.STATISTICS
            if row.get(f"{name}_lo") is not None and not math.isnan(row[f"{name}_lo"])
        }
        return cls(**{k: v for k, v in row.items() if k in names}, intervals=intervals)


def _one_bin(
    bin_id: int,
    values: np.ndarray,
    clusters: np.ndarray | None,
    floor: BinFloor | None,
    resamples: int,
    seed: int,
) -> BinStats:
    p1, p5, p10, p50 = (float(v) for v in np.percentile(values, PERCENTILES))
    fit: BetaFit = fit_beta_tail(values, TAIL_THRESHOLD, MIN_TAIL)
    samples, intervals = None, {}
    if clusters is not None:
        samples = int(np.unique(clusters).size)
        intervals = bootstrap.bootstrap_intervals(values, clusters, resamples, seed=(seed, bin_id))
    mean = float(min(max(values.mean(), 0.0), 1.0))  # rounding can step past 1 by an ulp
    return BinStats(
        bin=bin_id,
        n=int(values.size),
        mean=mean,
        p1=p1,
        p5=p5,
        p10=p10,
        p50=p50,
        beta_a=fit.a,
        beta_b=fit.b,
        beta_var=fit.var,
        ks=fit.ks,
        tail_n=fit.n,
        min=min(float(values.min()), p1),
        share_below_half=float(np.count_nonzero(values < LOW_ACCEPTANCE)) / values.size,
        samples=samples or 0,
        counted=floor is None or floor.admits(int(values.size), samples),
        intervals=intervals,
    )


def bin_statistics(
    positions: Any,
    acceptance: Any,
    bin_tokens: int = BIN_TOKENS,
    num_bins: int | None = None,
    *,
    samples: Any = None,
    floor: BinFloor | None = None,
    resamples: int = bootstrap.RESAMPLES,
    seed: int = 0,
) -> list[BinStats]:
    """One BinStats per length bin that holds tokens, in bin order.

    positions: total positions (integers >= 0); acceptance: per-token alpha in [0, 1], same
    shape. Bins with no tokens are left out. samples: each token's trajectory id (any
    integers; None: no intervals, samples 0); floor: None counts every bin; seed: the bootstrap's
    (each bin draws from (seed, bin)).
    """
    position_array = to_numpy(positions, "positions")
    acceptance_array = to_numpy(acceptance, "acceptance")
    if position_array.shape != acceptance_array.shape:
        raise MismatchError(
            f"positions has shape {position_array.shape} but acceptance has {acceptance_array.shape}"
        )
    values = check_acceptance(acceptance_array)
    bins = np.asarray(bin_index(position_array.reshape(-1), bin_tokens, num_bins))
    order = np.argsort(bins, kind="stable")
    bin_ids, starts = np.unique(bins[order], return_index=True)
    groups = np.split(values[order], starts[1:])
    if samples is None:
        clusters = [None] * len(groups)
    else:
        ids = to_numpy(samples, "samples").reshape(-1)
        if ids.size != values.size:
            raise MismatchError(f"samples has {ids.size} entries but acceptance has {values.size}")
        clusters = np.split(ids[order], starts[1:])
    return [
        _one_bin(int(b), group, ids, floor, resamples, seed)
        for b, group, ids in zip(bin_ids, groups, clusters)
    ]


# tail summaries


def min_p5(stats: Sequence[BinStats]) -> float:
    """The lowest p5 of the counted bins (the number the controller holds above its target);
    NaN when every bin is below the floor."""
    if not stats:
        raise MismatchError("min_p5 needs at least one bin of statistics, got none")
    return min((s.p5 for s in stats if s.counted), default=math.nan)


def bins_below(stats: Sequence[BinStats], target: float) -> list[int]:
    """Counted bins whose p5 is strictly below target, in bin order."""
    if not 0.0 <= target <= 1.0:
        raise MismatchError(f"target must be in [0, 1], got {target}")
    return sorted(s.bin for s in stats if s.counted and s.p5 < target)
