"""The pre-registered analysis of the stability study (docs/study.md, "The study of
2026-11-27" and its addenda), written before any seed ran. Pure: plain rows in, numbers out.

    units = [Unit(variant="v2", seed=0, arm="fixed", outcome=0.31, gap=-0.4, start=0.33,
                  peak=0.35, peak_step=20, steps=100, stats={"p5": 0.2, ...}), ...]
    label(unit)                                  # "destabilized" | "stable" | "stalled"
    predictor(units, "p5_first20")               # AUC for "not stable", Spearman with gap, CIs
    non_inferior(units, "rule-0.86", cost_ratio) # question (b) for one arm
    rule_sufficient(units)                       # question (c)

A unit is one arm of one seed. Labels, first match wins: destabilized when the outcome is
below the start by more than 0.05, or below the arm's in-run peak by more than 0.10 with the
peak after step 30; stable when the gap to dense is at least -0.05 and the arm did 100 steps;
stalled otherwise. A unit with fewer than 100 steps is flagged, one with fewer than 50 left
out (missing). The sparse units are every arm but dense.

Confidence intervals resample seeds (10,000 draws with replacement, every arm of a drawn seed
together, so the resampling respects the machine a seed ran on); a statistic is oriented so
that higher means "looks fine" before its AUC (P(a stable unit's value > a not-stable unit's),
ties a half) is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sparrow.experiments.study import auc, interval95

DENSE = "dense"
STEPS = 100
MIN_STEPS = 50
START_MARGIN = 0.05
PEAK_MARGIN = 0.10
PEAK_AFTER = 30
GAP_MARGIN = -0.05
RESAMPLES = 10_000
COST_SHARE = 0.30
# statistics where a lower value looks fine (the rest: higher looks fine)
LOWER_IS_FINE = ("share_below_half", "S", "S_lookup", "ks")


@dataclass(frozen=True)
class Unit:
    variant: str
    seed: int
    arm: str
    outcome: float | None  # held-out accuracy of the arm's last checkpoint
    gap: float | None  # outcome - outcome(dense), same variant and seed
    start: float | None  # the starting model scored the same way
    peak: float | None  # highest in-run eval/accuracy
    peak_step: int | None
    steps: int
    stats: Mapping[str, float] = field(default_factory=dict)
    # the secondary questions' per-unit values (sparrow/experiments/study_secondary.py) and
    # the per-role statistics reported beside the predictors ("roles": {role: {name: value}})
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def sparse(self) -> bool:
        return self.arm != DENSE


def set_gaps_to_dense(arms: Mapping[str, dict]) -> None:
    """Each summary entry's `gap_to_dense`: its outcome's accuracy minus the dense arm's (None
    where either has no outcome)."""
    dense = arms.get(DENSE, {}).get("outcome", {}).get("accuracy")
    for entry in arms.values():
        accuracy = entry.get("outcome", {}).get("accuracy")
        entry["gap_to_dense"] = None if None in (dense, accuracy) else accuracy - dense


def mismatch_per_step_from_roles(
    roles: Sequence[Mapping], trajectories: Mapping[int, int], role: str | None = None
) -> dict[int, float]:
    """Per step, the mean over its trajectories of S (sum of 1 - acceptance) over the tokens of
    `role` (every role: None), from the per-step, per-role table (rows with step, role, tokens
    and mean acceptance): tokens x (1 - mean), summed over the rows, is the step's total, and
    `trajectories[step]` divides it. This is "S over lookups" for seeds whose sample_stats did
    not record it. A step with rows but none of `role` gives 0 (its trajectories have no such
    token); a step missing from `trajectories` or from the table is left out."""
    totals: dict[int, float] = {}
    for row in roles:
        step = int(row["step"])
        if step not in trajectories:
            continue
        totals.setdefault(step, 0.0)
        if role is None or row.get("role") == role:
            totals[step] += row["tokens"] * (1.0 - row["mean"])
    return {step: total / trajectories[step] for step, total in totals.items()}


def worst_tail_per_step(tail: Sequence[Mapping], bins: Sequence[Mapping]) -> dict[int, float]:
    """step -> the lowest p0.1 (`p0_1`) over the step's length bins that bin_stats counted
    (rows of both with step and bin; a bin bin_stats has no row for, or did not count, is
    left out, as worst_per_step leaves it out for the other statistics)."""
    counted = {(int(r["step"]), int(r["bin"])) for r in bins if r.get("counted") is not False}
    worst: dict[int, float] = {}
    for row in tail:
        key, value = (int(row["step"]), int(row["bin"])), row.get("p0_1")
        if key in counted and value is not None and math.isfinite(value):
            worst[key[0]] = min(value, worst.get(key[0], math.inf))
    return dict(sorted(worst.items()))


def label(unit: Unit) -> str | None:
    """The unit's label (module doc); None when it is missing (under 50 steps, no outcome)."""
    if unit.steps < MIN_STEPS or unit.outcome is None:
        return None
    if unit.start is not None and unit.outcome < unit.start - START_MARGIN:
        return "destabilized"
    if (
        unit.peak is not None
        and unit.peak_step is not None
        and unit.peak_step > PEAK_AFTER
        and unit.outcome < unit.peak - PEAK_MARGIN
    ):
        return "destabilized"
    if unit.gap is not None and unit.gap >= GAP_MARGIN and unit.steps >= STEPS:
        return "stable"
    return "stalled"


WINDOWS = ("_first20", "_all")  # a statistic's name ends in the steps its mean is over


def oriented(name: str, value: float) -> float:
    """The statistic (`<statistic><window>`) on the "higher looks fine" axis."""
    base = next((name.removesuffix(w) for w in WINDOWS if name.endswith(w)), name)
    return -value if base in LOWER_IS_FINE else value


def _labelled(units: Sequence[Unit], name: str) -> list[tuple[Unit, bool, float]]:
    """(unit, not stable, oriented value) for the sparse units that have a label and the
    statistic."""
    out = []
    for unit in units:
        found = label(unit)
        value = unit.stats.get(name)
        if unit.sparse and found is not None and value is not None and math.isfinite(value):
            out.append((unit, found != "stable", oriented(name, value)))
    return out


def predictor_auc(units: Sequence[Unit], name: str) -> float | None:
    """AUC of the statistic for "not stable" over the sparse units; None when every unit has
    the same label."""
    rows = _labelled(units, name)
    return auc([v for _, bad, v in rows if not bad], [v for _, bad, v in rows if bad])


def spearman(units: Sequence[Unit], name: str) -> float | None:
    """Spearman rank correlation of the (oriented) statistic with the gap to dense."""
    from scipy.stats import spearmanr

    rows = [(v, u.gap) for u, _, v in _labelled(units, name) if u.gap is not None]
    if len(rows) < 3 or len({v for v, _ in rows}) < 2 or len({g for _, g in rows}) < 2:
        return None
    return float(spearmanr([v for v, _ in rows], [g for _, g in rows]).statistic)


def seed_bootstrap(
    units: Sequence[Unit],
    value: Callable[[Sequence[Unit]], float | None],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """95% percentile interval of value(units) over resamples of the seeds (with replacement,
    every unit of a drawn seed together; a seed drawn twice counts twice). Draws where the
    value is undefined are left out; (None, None) when none is defined."""
    seeds = sorted({u.seed for u in units})
    by_seed = {s: [u for u in units if u.seed == s] for s in seeds}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        drawn = rng.choice(len(seeds), size=len(seeds), replace=True)
        sample = [u for i in drawn for u in by_seed[seeds[i]]]
        found = value(sample)
        if found is not None:
            values.append(found)
    return interval95(values)


def predictor(units: Sequence[Unit], name: str, resamples: int = RESAMPLES) -> dict:
    """Question (a) for one statistic on one variant's units: AUC and Spearman with CIs."""
    rows = _labelled(units, name)
    return {
        "statistic": name,
        "units": len(rows),
        "not_stable": sum(bad for _, bad, _ in rows),
        "auc": predictor_auc(units, name),
        "auc_ci": seed_bootstrap(units, lambda s: predictor_auc(s, name), resamples),
        "spearman": spearman(units, name),
        "spearman_ci": seed_bootstrap(units, lambda s: spearman(s, name), resamples),
    }


def auc_difference(
    units: Sequence[Unit], other: str, base: str = "p5_first20", resamples: int = RESAMPLES
) -> dict:
    """Paired bootstrap of AUC(other) - AUC(base) over the same seed draws."""

    def difference(sample: Sequence[Unit]) -> float | None:
        a, b = predictor_auc(sample, other), predictor_auc(sample, base)
        return None if a is None or b is None else a - b

    return {
        "other": other,
        "base": base,
        "difference": difference(units),
        "ci": seed_bootstrap(units, difference, resamples),
    }


def youden_threshold(units: Sequence[Unit], name: str) -> float | None:
    """The oriented threshold that maximises TPR - FPR for "not stable" (a value below it),
    among the midpoints of neighbouring values."""
    rows = _labelled(units, name)
    bad = [v for _, b, v in rows if b]
    good = [v for _, b, v in rows if not b]
    if not bad or not good:
        return None
    # cuts halfway between neighbouring values (a value itself would sit on a unit's edge)
    values = sorted({v for _, _, v in rows})
    best, best_j = None, -math.inf
    for cut in [(a + b) / 2 for a, b in zip(values, values[1:])] + [math.inf]:
        j = np.mean([v < cut for v in bad]) - np.mean([v < cut for v in good])
        if j > best_j:
            best, best_j = cut, j
    return best


def transfer(train: Sequence[Unit], test: Sequence[Unit], name: str) -> dict:
    """Youden's threshold on `train` (V2) applied to `test` (V3): share of the sparse units
    labelled right. Beside it (docs/study.md, twentieth addendum), two readings of a
    degenerate test: `one_label` when every sparse unit of `test` has the same label (a
    threshold that puts every value on one side is then "right" without telling anything
    apart), and `dense_stable`, the share of `test`'s dense units (stable by definition) the
    threshold calls stable."""
    cut = youden_threshold(train, name)
    rows = _labelled(test, name)
    if cut is None or not rows:
        return {"statistic": name, "threshold": cut, "share_right": None, "units": len(rows)}
    right = np.mean([(v < cut) == bad for _, bad, v in rows])
    dense = [
        oriented(name, u.stats[name])
        for u in test
        if not u.sparse and u.stats.get(name) is not None and math.isfinite(u.stats[name])
    ]
    return {
        "statistic": name,
        "threshold": cut,
        "share_right": float(right),
        "units": len(rows),
        "transfers": bool(right >= 0.8),
        "one_label": len({bad for _, bad, _ in rows}) == 1,
        "dense_stable": float(np.mean([v >= cut for v in dense])) if dense else None,
    }


def one_sided_lower(values: Sequence[float], level: float = 0.95) -> float | None:
    """Lower end of the one-sided t-interval of the mean; None under 2 values."""
    from scipy.stats import t

    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    return float(x.mean() - t.ppf(level, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def non_inferior(units: Sequence[Unit], arm: str, cost_ratio: float | None) -> dict:
    """Question (b) for one arm of one variant: the one-sided 95% t-interval of its paired
    gaps above -0.05, no seed destabilized, every seed at 100 steps, and its predicted rollout
    cost (scoring counted) at most 30% of dense's (`cost_ratio`: arm / dense)."""
    mine = [u for u in units if u.arm == arm]
    gaps = [u.gap for u in mine if u.gap is not None]
    labels = [label(u) for u in mine]
    lower = one_sided_lower(gaps)
    checks = {
        "gap_lower_bound": lower is not None and lower > GAP_MARGIN,
        "none_destabilized": "destabilized" not in labels,
        "all_100_steps": bool(mine) and all(u.steps >= STEPS for u in mine),
        "cost_at_most_30pct": cost_ratio is not None and cost_ratio <= COST_SHARE,
    }
    return {
        "arm": arm,
        "seeds": [u.seed for u in mine],
        "gaps": gaps,
        "gap_lower_95": lower,
        "labels": labels,
        "cost_ratio": cost_ratio,
        **checks,
        "non_inferior": all(checks.values()),
    }


def rule_sufficient(units: Sequence[Unit]) -> dict:
    """Question (c): "yes" when rule-0.86 is stable in all seeds while centroid-0.86 is not
    stable in at least 2; "no" when rule-0.86 is not stable in at least 2; "moot" when
    centroid-0.86 is stable in all; else "open"."""

    def stable_count(arm: str) -> tuple[int, int]:
        found = [label(u) for u in units if u.arm == arm]
        found = [x for x in found if x is not None]
        return sum(x == "stable" for x in found), len(found)

    rule, rule_n = stable_count("rule-0.86")
    centroid, centroid_n = stable_count("centroid-0.86")
    if centroid_n and centroid == centroid_n:
        answer = "moot"
    elif rule_n and rule == rule_n and centroid_n - centroid >= 2:
        answer = "yes"
    elif rule_n - rule >= 2:
        answer = "no"
    else:
        answer = "open"
    return {
        "rule_stable": [rule, rule_n],
        "centroid_stable": [centroid, centroid_n],
        "answer": answer,
    }


def inconclusive(units: Sequence[Unit]) -> list[str]:
    """The pre-registered reasons one variant's study says nothing (docs/study.md)."""
    reasons = []
    dense = [u for u in units if u.arm == DENSE and u.outcome is not None and u.start is not None]
    if sum(u.outcome - u.start < 0.10 for u in dense) >= 2:
        reasons.append("dense gained under 0.10 over the start in 2 or more seeds")
    fixed = [label(u) for u in units if u.arm == "fixed"]
    if fixed.count("stable") >= 2:
        reasons.append("the fixed arm came out stable (in 2 or more seeds)")
    sparse = {label(u) for u in units if u.sparse and label(u) is not None}
    if len(sparse) == 1:
        reasons.append(f"every sparse unit is {sparse.pop()}: no AUC")
    return reasons
