"""The study's secondary questions (docs/study.md, twelfth addendum): three things seed 0 of V2
showed, written down before seeds 1 and 2 ran and read on those two seeds only (seed 0 made
the questions, so it cannot test them). Pure: units and per-step rows in, answers out.

    divergence(steps)        # max over evals at step >= 20 of (reward, 10 steps) - eval
    raised_early(steps)      # did the controller raise the schedule by step 5
    tis_question(units)      # notis-0.75 - centroid-0.75 per seed: does TIS-off end higher again
    raise_question(units)    # centroid arms: stable exactly when raised by step 5
    divergence_question(units)  # is a divergence above 0.3 a sign of "not stable"

A unit's `extra` holds its `divergence` and `raised_early` (scripts/study_analysis.py fills
them from `<arm>_steps.csv`). A question whose confirmatory seeds are not all there answers
"pending".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sparrow.experiments.study import auc
from sparrow.experiments.study_analysis import Unit, label

CONFIRMATORY = (1, 2)
TIS_ARMS = ("notis-0.75", "centroid-0.75")
TIS_MARGIN = 0.05
RAISED_BY = 5
DIVERGENCE_FROM = 20  # evals at step 20 and later
DIVERGENCE_WINDOW = 10  # the reward's mean over this many steps up to the eval's
DIVERGENCE_BAR = 0.3


def divergence(steps: Sequence[Mapping]) -> float | None:
    """Max over evals at step >= 20 of the sparse actor's mean reward over the 10 steps up to
    the eval's, minus the dense policy's eval accuracy: high when the weights earn reward under
    the sparse actor and not under dense attention. None without such an eval."""
    reward = {int(r["step"]): r["reward/mean"] for r in steps if r.get("reward/mean") is not None}
    gaps = []
    for row in steps:
        step, accuracy = int(row["step"]), row.get("eval/accuracy")
        if accuracy is None or step < DIVERGENCE_FROM:
            continue
        window = [reward[s] for s in range(step - DIVERGENCE_WINDOW + 1, step + 1) if s in reward]
        if window:
            gaps.append(float(np.mean(window)) - accuracy)
    return max(gaps) if gaps else None


def raised_early(steps: Sequence[Mapping]) -> bool | None:
    """Whether the schedule's version passed 1 by step 5 (the controller raised or lowered it);
    None when no step up to 5 says."""
    versions = [
        r["schedule/version"]
        for r in steps
        if 1 <= int(r["step"]) <= RAISED_BY and r.get("schedule/version") is not None
    ]
    return max(versions) >= 2 if versions else None


def _confirmatory(units: Sequence[Unit]) -> tuple[list[Unit], bool]:
    mine = [u for u in units if u.seed in CONFIRMATORY and label(u) is not None]
    return mine, set(CONFIRMATORY) <= {u.seed for u in mine}


def tis_question(units: Sequence[Unit]) -> dict:
    """Per seed, notis-0.75's outcome minus centroid-0.75's; over seeds 1 and 2: "repeats" when
    it is above 0.05 in both, "does not repeat" when in neither, else "mixed"."""
    by = {(u.seed, u.arm): u.outcome for u in units if u.arm in TIS_ARMS}
    seeds = sorted({s for s, _ in by})
    diffs = {
        s: by[(s, TIS_ARMS[0])] - by[(s, TIS_ARMS[1])]
        for s in seeds
        if by.get((s, TIS_ARMS[0])) is not None and by.get((s, TIS_ARMS[1])) is not None
    }
    counted = [diffs[s] for s in CONFIRMATORY if s in diffs]
    if len(counted) < len(CONFIRMATORY):
        answer = "pending"
    elif all(d > TIS_MARGIN for d in counted):
        answer = "repeats"
    elif not any(d > TIS_MARGIN for d in counted):
        answer = "does not repeat"
    else:
        answer = "mixed"
    return {"differences": diffs, "answer": answer}


def raise_question(units: Sequence[Unit]) -> dict:
    """Centroid arms of seeds 1 and 2: "holds" when every one is stable exactly when its
    schedule was raised by step 5, else "fails" (with the units that break it)."""
    mine, complete = _confirmatory(units)
    centroid = [u for u in mine if u.arm.startswith("centroid-")]
    breaks = [
        f"s{u.seed} {u.arm}"
        for u in centroid
        if u.extra.get("raised_early") is None
        or bool(u.extra["raised_early"]) != (label(u) == "stable")
    ]
    answer = "pending" if not complete else ("fails" if breaks else "holds")
    return {"units": len(centroid), "breaks": breaks, "answer": answer}


def divergence_question(units: Sequence[Unit]) -> dict:
    """Sparse units of seeds 1 and 2: the AUC of divergence for "not stable" (lower looks fine),
    and "a sign of trouble" when every unit above 0.3 is not stable and one is, "no event"
    when none is above it, "not specific" when a stable unit is."""
    mine, complete = _confirmatory(units)
    scored = [
        (label(u) != "stable", u.extra["divergence"])
        for u in mine
        if u.sparse and u.extra.get("divergence") is not None
    ]
    fine = [-d for bad, d in scored if not bad]
    trouble = [-d for bad, d in scored if bad]
    above = [bad for bad, d in scored if d > DIVERGENCE_BAR]
    if not complete:
        answer = "pending"
    elif not above:
        answer = "no event"
    else:
        answer = "a sign of trouble" if all(above) else "not specific"
    return {
        "units": len(scored),
        "above_bar": len(above),
        "auc": auc(fine, trouble),
        "answer": answer,
    }
