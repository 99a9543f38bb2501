"""Length bins and per-bin acceptance statistics: what the controller watches per step.

    from sparrow.mismatch.acceptance import bin_index, bin_statistics, min_p5, bins_below
    stats = bin_statistics(positions, acceptance, bin_tokens=2000)   # list[BinStats]
    min_p5(stats); bins_below(stats, target=0.86)

Tokens are grouped by total position into bins of bin_tokens (2,000 by default); each bin
gets its count, mean, p1/p5/p10/p50 (numpy's default linear interpolation), the Beta fit
of its tail below 0.999 (sparrow/mismatch/fit.py), its minimum and the share of its
tokens below 0.5 (LOW_ACCEPTANCE; beyond the paper, for the stability study). Part of
sparrow.mismatch.acceptance, which re-exports the public names; `sparrow mismatch stats FILE.parquet` prints these rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from sparrow import schedule_math
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
LOW_ACCEPTANCE = 0.5


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
class BinStats:
    """Acceptance statistics of one length bin; beta_* and ks are NaN when the tail is too small.

    Percentiles are numpy's default (linear interpolation); tail_n counts tokens below 0.999,
    the ones the Beta fit sees; beta_var is the variance on the scaled [0, 1] axis; min is the
    lowest acceptance in the bin and share_below_half the share of its tokens below
    LOW_ACCEPTANCE (NaN when not computed: rows written before these existed).
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
        return asdict(self)


def _one_bin(bin_id: int, values: np.ndarray) -> BinStats:
    p1, p5, p10, p50 = (float(v) for v in np.percentile(values, PERCENTILES))
    fit: BetaFit = fit_beta_tail(values, TAIL_THRESHOLD, MIN_TAIL)
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
    )


def bin_statistics(
    positions: Any, acceptance: Any, bin_tokens: int = BIN_TOKENS, num_bins: int | None = None
) -> list[BinStats]:
    """One BinStats per length bin that holds tokens, in bin order.

    positions: total positions (integers >= 0); acceptance: per-token alpha in [0, 1], same
    shape. Bins with no tokens are left out.
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
    return [_one_bin(int(b), group) for b, group in zip(bin_ids, groups)]


# tail summaries


def min_p5(stats: Sequence[BinStats]) -> float:
    """The lowest per-bin p5 (the number the controller holds above its target)."""
    if not stats:
        raise MismatchError("min_p5 needs at least one bin of statistics, got none")
    return min(s.p5 for s in stats)


def bins_below(stats: Sequence[BinStats], target: float) -> list[int]:
    """Bins whose p5 is strictly below target, in bin order."""
    if not 0.0 <= target <= 1.0:
        raise MismatchError(f"target must be in [0, 1], got {target}")
    return sorted(s.bin for s in stats if s.p5 < target)
