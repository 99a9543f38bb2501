"""Does a step's statistic warn that the sparse actor's reward is about to collapse?

On V3's seed 0 every controlled arm's reward fell to near 0 at least once, in a step or two,
while the controller's worst-bin p5 stayed flat (docs/study.md, twentieth addendum). This
module asks, step by step, which statistic measured at step t rose before such a collapse at
steps t+1..t+HORIZON. Seed 0 of V3 made the question; the addendum fixes the signal and its
threshold before V3's seeds 1-2 run, and V2's three seeds (which did not make it) are read as
a check. Pure: per-step rows in, answers out.

    rewards(rows)                         # step -> the sparse actor's mean reward
    onsets(rewards)                       # the steps where the reward collapsed
    step_labels(rewards)                  # step -> True (a collapse within HORIZON) / False
    SIGNALS                               # the statistics read, each with its orientation
    warning_values(rows, signal)          # step -> the warning value (higher = more alarm)
    pooled_auc(units, signal)             # step-level AUC over every unit's labelled steps
    unit_bootstrap(per_unit[, base])      # its 95% interval over resamples of the units
    youden(units, signal)                 # the threshold with the largest sens - false alarms
    alarm_rates(units, signal, threshold) # collapses warned of, labelled steps alarmed

A unit is one sparse arm of one seed: {"name": ..., "rows": [step rows of <arm>_steps.csv]}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sparrow.experiments.study import auc, interval95

REWARD = "reward/mean"
WINDOW = 5  # the steps before t whose mean reward is t's baseline
HEALTHY = 0.3  # a baseline at least this high: the actor was earning
DROP = 0.4  # a collapse: the reward below this share of its baseline
AFTER = 10  # steps after a collapse that are neither labelled nor a new collapse
HORIZON = 5  # a step is positive when a collapse follows within this many steps
TRAIL = 10  # the relative signals divide by the median of this many steps before

# name -> (column of <arm>_steps.csv, +1 when a higher value is more alarming else -1,
#          relative: divided by the unit's own trailing median)
SIGNALS: dict[str, tuple[str, int, bool]] = {}
for _name, _column, _sign in (
    ("mismatch_kl", "actor/mismatch_kl", 1),
    ("S_max", "mismatch/sequence_mismatch_max", 1),
    ("S_mean", "mismatch/sequence_mismatch_mean", 1),
    ("p5_worst_bin", "mismatch/min_p5", -1),
    ("acceptance_mean", "mismatch/acceptance_mean", -1),
    ("ess", "mismatch/ess", -1),
    ("tis_truncated", "actor/tis_truncated_frac", 1),
    ("grad_norm", "actor/grad_norm", 1),
    ("approx_kl", "actor/approx_kl", 1),
):
    SIGNALS[_name] = (_column, _sign, False)
    SIGNALS[_name + "_rel"] = (_column, _sign, True)
# two nulls: collapses came mid-run (and mismatch drifts with steps); a reward already falling
SIGNALS["step"] = ("step", 1, False)
SIGNALS["reward"] = (REWARD, -1, False)
SIGNALS["reward_rel"] = (REWARD, -1, True)


def rewards(rows: Sequence[Mapping]) -> dict[int, float]:
    """step -> the sparse actor's mean reward, over the rows that have one."""
    return {int(r["step"]): float(r[REWARD]) for r in rows if r.get(REWARD) is not None}


def _baseline(per_step: Mapping[int, float], step: int) -> float | None:
    """Mean reward over the WINDOW steps before step; None unless all are there."""
    before = [per_step.get(s) for s in range(step - WINDOW, step)]
    return None if any(v is None for v in before) else float(np.mean(before))


def onsets(per_step: Mapping[int, float]) -> list[int]:
    """Steps whose reward fell below DROP x its baseline from a baseline of at least HEALTHY,
    none within AFTER steps of the one before."""
    found: list[int] = []
    for step in sorted(per_step):
        base = _baseline(per_step, step)
        if found and step <= found[-1] + AFTER:
            continue
        if base is not None and base >= HEALTHY and per_step[step] < DROP * base:
            found.append(step)
    return found


def step_labels(per_step: Mapping[int, float]) -> dict[int, bool]:
    """step -> whether a collapse begins within steps+1..step+HORIZON, for the steps where the
    actor was earning (the mean over WINDOW steps up to and including it at least HEALTHY),
    that are not a collapse or within AFTER steps after one, and whose HORIZON is inside the
    run."""
    starts = onsets(per_step)
    last = max(per_step, default=0)
    labels = {}
    for step in sorted(per_step):
        if step + HORIZON > last or any(s <= step <= s + AFTER for s in starts):
            continue
        earning = _baseline(per_step, step + 1)  # steps step-WINDOW+1 .. step
        if earning is None or earning < HEALTHY:
            continue
        labels[step] = any(step < s <= step + HORIZON for s in starts)
    return labels


def warning_values(rows: Sequence[Mapping], signal: str) -> dict[int, float]:
    """step -> the signal oriented so that higher is more alarming (the relative signals: the
    value over the median of the TRAIL steps before, defined once TRAIL steps are there)."""
    column, sign, relative = SIGNALS[signal]
    raw = {
        int(r["step"]): float(r[column])
        for r in rows
        if r.get(column) is not None and np.isfinite(float(r[column]))
    }
    if not relative:
        return {step: sign * value for step, value in raw.items()}
    out = {}
    for step, value in raw.items():
        before = [raw.get(s) for s in range(step - TRAIL, step)]
        if any(v is None for v in before):
            continue
        median = float(np.median(before))
        if median > 0:
            out[step] = sign * value / median
    return out


def unit_pairs(
    unit: Mapping, signal: str, labels: Mapping[int, bool] | None = None
) -> list[tuple[bool, float]]:
    """(collapse follows, warning value) over one unit's labelled steps with a value (labels:
    the unit's step_labels, when already at hand)."""
    values = warning_values(unit["rows"], signal)
    if labels is None:
        labels = step_labels(rewards(unit["rows"]))
    return [(positive, values[step]) for step, positive in labels.items() if step in values]


def labelled(units: Sequence[Mapping], signal: str) -> list[tuple[bool, float]]:
    """unit_pairs over every unit."""
    return [pair for unit in units for pair in unit_pairs(unit, signal)]


def _auc(pairs: Sequence[tuple[bool, float]]) -> float | None:
    # study.auc reads "higher looks fine": flip the warnings
    return auc([-v for bad, v in pairs if not bad], [-v for bad, v in pairs if bad])


def pooled_auc(units: Sequence[Mapping], signal: str) -> float | None:
    """P(a step before a collapse warns more than a step before none); None without both."""
    return _auc(labelled(units, signal))


def unit_bootstrap(
    per_unit: Sequence[Sequence[tuple[bool, float]]],
    base: Sequence[Sequence[tuple[bool, float]]] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """95% percentile interval of the pooled AUC over resamples of the units (each unit's
    labelled steps, unit_pairs, drawn together); with base (another signal's unit_pairs, the
    units in the same order), of the AUC minus base's on the same draws. Draws where it is
    undefined are left out."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(resamples):
        drawn = rng.choice(len(per_unit), size=len(per_unit), replace=True)
        one = _auc([pair for i in drawn for pair in per_unit[i]])
        if base is not None and one is not None:
            other = _auc([pair for i in drawn for pair in base[i]])
            one = None if other is None else one - other
        if one is not None:
            found.append(one)
    return interval95(found)


def youden(units: Sequence[Mapping], signal: str) -> float | None:
    """The warning value that maximises (positives at or above it) - (negatives at or above
    it), each as a share; None without both kinds of step."""
    pairs = labelled(units, signal)
    pos = np.array([v for bad, v in pairs if bad])
    neg = np.array([v for bad, v in pairs if not bad])
    if not pos.size or not neg.size:
        return None
    candidates = np.unique(np.concatenate([pos, neg]))
    scores = [(pos >= c).mean() - (neg >= c).mean() for c in candidates]
    return float(candidates[int(np.argmax(scores))])


def alarm_rates(units: Sequence[Mapping], signal: str, threshold: float) -> dict:
    """How a fixed threshold does: the collapses with an alarm at one of the HORIZON steps
    before them, and the share of labelled steps without a collapse ahead that alarm."""
    warned = collapses = false = quiet = 0
    for unit in units:
        per_step = rewards(unit["rows"])
        values = warning_values(unit["rows"], signal)
        for start in onsets(per_step):
            collapses += 1
            warned += any(
                values.get(s, -np.inf) >= threshold for s in range(start - HORIZON, start)
            )
        for step, positive in step_labels(per_step).items():
            if not positive and step in values:
                quiet += 1
                false += values[step] >= threshold
    return {
        "collapses": collapses,
        "warned": warned,
        "quiet_steps": quiet,
        "false_alarms": false,
        "false_alarm_share": false / quiet if quiet else None,
    }


def report(units: Sequence[Mapping], resamples: int = 2000, null: str = "reward") -> list[dict]:
    """Every signal's pooled AUC with its unit-bootstrap interval, and its AUC minus the null's
    (a reward already falling) with the paired interval; best first."""
    labels = [step_labels(rewards(unit["rows"])) for unit in units]
    base = [unit_pairs(unit, null, steps) for unit, steps in zip(units, labels)]
    null_auc = _auc([pair for one in base for pair in one])
    rows = []
    for signal in SIGNALS:
        per_unit = [unit_pairs(unit, signal, steps) for unit, steps in zip(units, labels)]
        pairs = [pair for one in per_unit for pair in one]
        found = _auc(pairs)
        rows.append(
            {
                "signal": signal,
                "steps": len(pairs),
                "before_collapse": sum(bad for bad, _ in pairs),
                "auc": found,
                "auc_ci": unit_bootstrap(per_unit, resamples=resamples),
                f"minus_{null}": None if found is None or null_auc is None else found - null_auc,
                f"minus_{null}_ci": unit_bootstrap(per_unit, base, resamples=resamples),
            }
        )
    return sorted(rows, key=lambda r: -(r["auc"] if r["auc"] is not None else -1))
