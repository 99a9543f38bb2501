"""The pre-registered analysis of the one-step-off check (docs/async.md, "Does one-step-off
training track the synchronous run?"), written before any run of it. Pure: numbers in,
numbers out.

    equivalence([0.01, -0.02, 0.00])      # mean gap, its 90% t-interval, the verdict
    learning_phase({10: 0.4, 20: 0.6, 60: 0.9})   # mean in-run eval of steps 10-50
    verdict({"async-0.86": eq1, "async-dense": eq2}, destabilized=[])

A pair's gap is the one-step-off arm's outcome minus its synchronous partner's, one per seed.
The pair tracks when the two-sided 90% t-interval of the mean gap (two one-sided tests at 5%)
lies within +-MARGIN; it is refuted when the interval lies wholly outside that band, and
inconclusive otherwise (or with fewer than two seeds). One-step-off tracks the synchronous
run when every pair tracks and no one-step-off unit is destabilized (docs/study.md's label).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

# (one-step-off arm, its synchronous partner, where the partner ran)
PAIRS = (
    ("async-0.86", "centroid-0.86", "the same hold"),
    ("async-dense", "dense", "the stability study's hold of the same seed"),
)
MARGIN = 0.05
LEVEL = 0.90
LEARNING_STEPS = (10, 50)


def equivalence(gaps: Sequence[float], margin: float = MARGIN, level: float = LEVEL) -> dict:
    """Mean paired gap, its two-sided `level` t-interval and the verdict (module doc)."""
    from scipy.stats import t

    x = np.asarray([g for g in gaps if g is not None], dtype=np.float64)
    result: dict = {"seeds": int(x.size), "mean": float(x.mean()) if x.size else None}
    if x.size < 2:
        return {**result, "interval": None, "verdict": "inconclusive"}
    half = t.ppf(1 - (1 - level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    lo, hi = float(x.mean() - half), float(x.mean() + half)
    if -margin < lo and hi < margin:
        verdict = "tracks"
    elif hi < -margin or lo > margin:
        verdict = "refuted"
    else:
        verdict = "inconclusive"
    return {**result, "interval": [lo, hi], "verdict": verdict}


def learning_phase(evals: Mapping[int, float], steps: tuple[int, int] = LEARNING_STEPS):
    """Mean in-run eval accuracy over the steps in [first, last]; None when none were run."""
    inside = [v for s, v in evals.items() if steps[0] <= s <= steps[1] and v is not None]
    return sum(inside) / len(inside) if inside else None


def verdict(pairs: Mapping[str, dict], destabilized: Sequence[str]) -> str:
    """tracks / refuted / inconclusive over every pair's equivalence and the labels."""
    verdicts = [pairs.get(arm, {}).get("verdict", "inconclusive") for arm, _, _ in PAIRS]
    if destabilized or "refuted" in verdicts:
        return "refuted"
    return "tracks" if all(v == "tracks" for v in verdicts) else "inconclusive"
