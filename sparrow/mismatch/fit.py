"""The Beta fit of the acceptance tail, and the array checks the mismatch statistics share.

Most tokens accept at above 0.999 even under a collapse-inducing budget; the values below
0.999 follow a scaled Beta distribution on [0, 0.999] (docs/method.md, "Bins and the tail statistic"). This
module fits that Beta by maximum likelihood and measures the fit:

    from sparrow.mismatch.fit import fit_beta_tail
    fit = fit_beta_tail(acceptance)          # BetaFit(a, b, var, ks, n)

The variance reported is that of the scaled variable x = alpha / 0.999 on [0, 1], which is
the quantity the paper compares across budgets (0.19 at 512 tokens vs 0.05 at 16384).
Departure from a plain Beta fit: tail values are clipped to [1e-6, 1 - 1e-6] before fitting,
since the Beta likelihood is infinite or zero at the ends and an acceptance of exactly 0 can
occur. Part of sparrow.mismatch.acceptance, which re-exports the public names.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparrow.errors import SparrowError

TAIL_THRESHOLD = 0.999
MIN_TAIL = 20
_FIT_EPS = 1e-6


class MismatchError(SparrowError, ValueError):
    """Bad input to a mismatch computation (the message names the argument and the problem)."""


@dataclass(frozen=True)
class BetaFit:
    """Beta(a, b) fitted to the tail values scaled to [0, 1]; NaN fields when not fitted.

    n counts the tail values (those below the threshold), fitted or not; var is the variance
    of the scaled variable on [0, 1]; ks is the Kolmogorov-Smirnov statistic of the tail
    against the fitted Beta.
    """

    a: float
    b: float
    var: float
    ks: float
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise MismatchError(f"BetaFit.n must be >= 0, got {self.n}")
        values = (self.a, self.b, self.var, self.ks)
        if all(math.isnan(v) for v in values):
            return
        if not (self.a > 0 and self.b > 0):
            raise MismatchError(f"BetaFit needs a > 0 and b > 0, got a={self.a}, b={self.b}")
        if not 0.0 <= self.var <= 0.25:
            raise MismatchError(f"BetaFit.var must be in [0, 0.25], got {self.var}")
        if not 0.0 <= self.ks <= 1.0:
            raise MismatchError(f"BetaFit.ks must be in [0, 1], got {self.ks}")

    @classmethod
    def unfitted(cls, n: int) -> BetaFit:
        nan = float("nan")
        return cls(a=nan, b=nan, var=nan, ks=nan, n=n)

    @property
    def fitted(self) -> bool:
        return not math.isnan(self.a)


def beta_variance(a: float, b: float) -> float:
    """Variance of Beta(a, b) on [0, 1]."""
    total = a + b
    return a * b / (total * total * (total + 1.0))


def to_numpy(values: Any, name: str) -> np.ndarray:
    """A numpy copy of a torch tensor, numpy array, list or scalar (bf16 goes through fp32)."""
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch here
        tensor = values.detach().cpu()
        if tensor.is_floating_point() and tensor.dtype.itemsize < 4:
            tensor = tensor.float()
        return tensor.numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as err:
        raise MismatchError(f"{name} must be an array of numbers: {err}") from None


def first_bad(mask: np.ndarray, values: np.ndarray) -> str:
    """'<count> bad rows, first at row <i>: <value>' for a boolean mask of bad rows."""
    index, count = int(np.flatnonzero(mask)[0]), int(mask.sum())
    value = values[index].item() if hasattr(values[index], "item") else values[index]
    return f"{count} bad row{'' if count == 1 else 's'}, first at row {index}: {value!r}"


def check_acceptance(values: Any, name: str = "acceptance") -> np.ndarray:
    """Acceptance rates as a flat float64 array, refusing NaN and values outside [0, 1]."""
    array = to_numpy(values, name)
    if array.dtype.kind not in "biuf":
        raise MismatchError(f"{name} must be numbers, got dtype {array.dtype}")
    array = array.astype(np.float64).reshape(-1)
    bad = ~((array >= 0.0) & (array <= 1.0))  # NaN fails both comparisons
    if bad.any():
        raise MismatchError(f"{name} must be in [0, 1] and not NaN: {first_bad(bad, array)}")
    return array


def fit_beta_tail(
    acceptance: Any, threshold: float = TAIL_THRESHOLD, min_tail: int = MIN_TAIL
) -> BetaFit:
    """Maximum-likelihood Beta fit of the acceptance values below `threshold`.

    The tail is scaled to [0, 1] by x = alpha / threshold (the paper's Beta on [0, 0.999] with
    loc 0 and scale 0.999 fixed). Fewer than `min_tail` tail values, a tail of one repeated
    value, or a solver failure give NaN fit fields (n still counts the tail), never an error.
    """
    if not 0.0 < threshold <= 1.0:
        raise MismatchError(f"threshold must be in (0, 1], got {threshold}")
    if min_tail < 2:
        raise MismatchError(f"min_tail must be >= 2, got {min_tail}")
    values = check_acceptance(acceptance)
    tail = values[values < threshold] / threshold
    if tail.size < min_tail or np.ptp(tail) == 0.0:
        return BetaFit.unfitted(int(tail.size))
    tail = np.clip(tail, _FIT_EPS, 1.0 - _FIT_EPS)
    from scipy import stats  # imported here: scipy.stats is slow to import and rarely needed

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            a, b, _, _ = stats.beta.fit(tail, floc=0.0, fscale=1.0)
    except (RuntimeError, ValueError):  # scipy's FitError is a RuntimeError
        return BetaFit.unfitted(int(tail.size))
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
        return BetaFit.unfitted(int(tail.size))
    ks = float(stats.kstest(tail, stats.beta(a, b).cdf).statistic)
    return BetaFit(a=a, b=b, var=beta_variance(a, b), ks=ks, n=int(tail.size))
