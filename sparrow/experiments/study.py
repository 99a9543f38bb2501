"""The stability study's numbers: collapse labels, how well a statistic separates collapsed arms
from stable ones, and the cost model's price of one step's rollout. Pure: no storage.

    labels = collapse_labels({"dense": [...], "fixed": [...]}, "dense", window=5, ratio=0.8)
    auc([stable step values], [collapsed step values])            # 1.0: every stable step better
    separation({"dense": {1: 0.9, ...}, ...}, labels, get_statistic("p5"))
    passes_at_target(per_arm, labels, {"p5-0.86": 0.86}, get_statistic("p5"))   # false passes
    step_rollout_cost(schedule, model=shape, hardware=hw, prompt_len=40, gen_len=200,
                      samples_per_prompt=8, prompts=4)               # (eFLOPs, dense eFLOPs)

Collapse (docs/study-tool.md): an arm collapsed when the mean of its last `window` rewards is below
`ratio` x the reference (dense) arm's; the reference is stable by definition, and no arm gets
a label (None) when the reference has no reward or a mean <= 0 (the rule assumes rewards >= 0).

Separation: per step, a statistic's worst bin (lowest p5, highest share below 0.5, ...);
auc is the Mann-Whitney probability that a step of a stable arm shows a better value than a
step of a collapsed arm (ties count a half): 1.0 separates perfectly, 0.5 is chance, below
0.5 is backwards. It is given over steps (every step of every labelled arm) and over arms
(each arm's mean over its steps); with few arms the arm-level value is coarse (1 collapsed arm
against 3 stable ones can only give 0, 1/3, 2/3 or 1). When the only stable arm decodes
densely, every statistic separates it (dense acceptance is about 1) and the AUC tests
nothing; passes_at_target then says more: how often a collapsed sparse arm met its own
target on the statistic, i.e. how often the statistic held at that target would have called
a collapsing run fine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from sparrow.costmodel import Hardware, ModelShape, schedule_cost
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import TargetStatistic


def last_mean(values: Sequence[float], window: int) -> float | None:
    """Mean of the last `window` values (all of them when fewer); None when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite[-window:])) if finite else None


def collapse_labels(
    rewards: Mapping[str, Sequence[float]], reference: str, window: int, ratio: float
) -> tuple[dict[str, bool | None], float | None]:
    """({arm: collapsed, or None when undecidable}, the reference arm's final mean reward)."""
    finals = {arm: last_mean(values, window) for arm, values in rewards.items()}
    reference_final = finals.get(reference)
    if reference_final is None or reference_final <= 0:
        return {arm: None for arm in rewards}, reference_final
    labels = {
        arm: (None if final is None else final < ratio * reference_final)
        for arm, final in finals.items()
    }
    labels[reference] = False
    return labels, reference_final


def auc(stable: Sequence[float], collapsed: Sequence[float]) -> float | None:
    """P(a stable value > a collapsed value) + P(equal) / 2; None when either side is empty."""
    if not len(stable) or not len(collapsed):
        return None
    good, bad = np.asarray(stable, dtype=np.float64), np.asarray(collapsed, dtype=np.float64)
    greater = (good[:, None] > bad[None, :]).sum()
    ties = (good[:, None] == bad[None, :]).sum()
    return float((greater + 0.5 * ties) / (good.size * bad.size))


def interval95(draws: Sequence[float]) -> tuple[float | None, float | None]:
    """The 95% percentile interval of bootstrap draws; (None, None) when there are none."""
    if not len(draws):
        return None, None
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


def worst_per_step(rows: Sequence[Mapping], statistic: TargetStatistic) -> dict[int, float]:
    """step -> the statistic's worst bin (rows: bin_stats rows; NULL values and bins below
    the floor, counted false, left out)."""
    return {step: row[statistic.column] for step, row in worst_rows(rows, statistic).items()}


def worst_rows(rows: Sequence[Mapping], statistic: TargetStatistic) -> dict[int, Mapping]:
    """step -> the bin_stats row of the statistic's worst counted bin (bounds and all)."""
    by_step: dict[int, list[Mapping]] = {}
    for row in rows:
        value = row.get(statistic.column)
        if value is not None and math.isfinite(value) and row.get("counted") is not False:
            by_step.setdefault(int(row["step"]), []).append(row)
    key = (
        (lambda r: r[statistic.column])
        if statistic.higher_is_better
        else (lambda r: -r[statistic.column])
    )
    return {step: min(found, key=key) for step, found in sorted(by_step.items())}


def worst_bounds_mean(rows: Sequence[Mapping], statistic: TargetStatistic) -> tuple | None:
    """(mean over steps of the worst bin's low bound, of its high bound); None without bounds."""
    worst = [
        r
        for r in worst_rows(rows, statistic).values()
        if r.get(f"{statistic.column}_lo") is not None
    ]
    if not worst:
        return None
    return tuple(
        float(np.mean([r[f"{statistic.column}_{side}"] for r in worst])) for side in ("lo", "hi")
    )


def separation(
    per_arm: Mapping[str, Mapping[int, float]],
    labels: Mapping[str, bool | None],
    statistic: TargetStatistic,
) -> dict:
    """How well the per-step worst-bin statistic tells collapsed arms from stable ones."""
    sides: dict[bool, list[str]] = {False: [], True: []}
    for arm, label in labels.items():
        if label is not None and per_arm.get(arm):
            sides[label].append(arm)

    def oriented(arms: list[str], per_step: bool) -> list[float]:
        if per_step:
            return [statistic.oriented(v) for arm in arms for v in per_arm[arm].values()]
        return [statistic.oriented(float(np.mean(list(per_arm[arm].values())))) for arm in arms]

    return {
        "statistic": statistic.name,
        "higher_is_better": statistic.higher_is_better,
        "step_auc": auc(oriented(sides[False], True), oriented(sides[True], True)),
        "arm_auc": auc(oriented(sides[False], False), oriented(sides[True], False)),
        "stable_arms": sides[False],
        "collapsed_arms": sides[True],
        "stable_steps": sum(len(per_arm[a]) for a in sides[False]),
        "collapsed_steps": sum(len(per_arm[a]) for a in sides[True]),
    }


def passes_at_target(
    per_arm: Mapping[str, Mapping[int, float]],
    labels: Mapping[str, bool | None],
    targets: Mapping[str, float | None],
    statistic: TargetStatistic,
) -> dict:
    """How often the statistic, held at each arm's own target, calls a step fine: the share of
    steps whose worst bin meets the target, over the collapsed arms (a false pass: the
    statistic would not have warned) and over the stable ones. Only arms with a target take
    part (a dense arm has none); None where a side has no steps. Meaningful for statistics on
    the acceptance scale (p1, p5, p10, mean, min), whose target is an acceptance level."""
    counts = {True: [0, 0], False: [0, 0]}  # label -> [steps meeting the target, steps]
    for arm, label in labels.items():
        target = targets.get(arm)
        if label is None or target is None:
            continue
        for value in per_arm.get(arm, {}).values():
            counts[label][0] += not statistic.misses(value, target)
            counts[label][1] += 1

    def share(label: bool) -> float | None:
        met, steps = counts[label]
        return met / steps if steps else None

    return {
        "statistic": statistic.name,
        "collapsed_pass": share(True),
        "collapsed_steps": counts[True][1],
        "stable_pass": share(False),
        "stable_steps": counts[False][1],
    }


def step_rollout_cost(
    schedule: Schedule | None,
    *,
    model: ModelShape,
    hardware: Hardware,
    prompt_len: float,
    gen_len: float,
    samples_per_prompt: int,
    prompts: int,
    scoring: str = "pages",
) -> tuple[float, float]:
    """(predicted eFLOPs of one step's rollout, the same decoded densely): `prompts` groups of
    `samples_per_prompt` samples of the mean length after the mean prompt; schedule None is
    dense decoding. Page scoring is priced per page of the prompt as the engine reads it
    (`scoring`, sparrow/costmodel/segments.py), not as the published formula's prompt term."""
    cost = schedule_cost(
        schedule or Schedule("dense", (1,)),
        model=model,
        hardware=hardware,
        prompt_len=int(round(prompt_len)),
        gen_len=max(1, int(round(gen_len))),
        samples=samples_per_prompt,
        scoring=scoring,
    )
    dense = cost.dense.total * prompts
    return (dense if schedule is None else cost.sparse.total * prompts), dense
