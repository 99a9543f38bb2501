"""The study report: per arm reward, held-out accuracy, per-bin p5, rollout cost and the tail
statistics; which arms collapsed and how well each statistic separates them. From DuckDB only.

    from sparrow.reports.study import write_study_report
    paths, summary = write_study_report("./sparrow-work", "s1", "./report")
    # sparrow study report s1 [--workdir DIR] [--out DIR] [--json]

Reads the study's rows (sparrow/reports/study_data.py) and writes, into the output folder, reward.png
(reward per step per arm; held-out accuracy beside it when an arm evaluated), p5_per_bin.png
(one panel per arm: p5 of every length bin over steps, against the arm's target),
rollout_cost.png (rollout seconds per step, the cost model's predicted eFLOPs relative to dense,
pages read per token), statistics.png (per statistic, the worst bin per step, collapsed arms
dashed), summary.json and summary.md. The numbers are sparrow/experiments/study.py's: collapse by the
study's rule (or the one given), separation as AUC per statistic. The cost model needs the
model's config.json (runs.model_path) and the step metric rollout/prompt_tokens_mean; without
either the predicted cost is left out and the summary says why.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from sparrow.costmodel import get_hardware
from sparrow.experiments.study import (
    collapse_labels,
    last_mean,
    passes_at_target,
    separation,
    step_rollout_cost,
    worst_bounds_mean,
    worst_per_step,
)
from sparrow.reports.run import fmt
from sparrow.reports.study_data import ArmData, StudyData, load_study_data
from sparrow.sparse.target import get_statistic

REWARD = "reward/mean"
EVAL = "eval/accuracy"
ROLLOUT_S = "time/rollout_generate_s"
TOKENS_PER_S = "rollout/tokens_per_s"
PAGES = "schedule/pages_read_mean"
# every target statistic (sparrow/sparse/target.py), in the order the report lists them
STATISTICS = tuple(get_statistic(n) for n in ("p1", "p5", "p10", "mean", "min", "share_below_half"))


def _json_ready(value: Any) -> Any:
    """JSON has no NaN or infinity: undefined numbers become null."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def model_shape_of(data: StudyData) -> tuple[Any, str]:
    """(the cost model's shape of the study's model, or None, and why not)."""
    from sparrow.control.calibration import model_shape

    paths = {a.run.get("model_path") for a in data.arms if a.run.get("model_path")}
    if not paths:
        return None, "no model path recorded"
    path = sorted(paths)[0]
    try:
        return model_shape(path), ""
    except (OSError, ValueError, KeyError, AttributeError) as err:
        return None, f"model config not readable at {path} ({type(err).__name__})"


def predicted_costs(arm: ArmData, data: StudyData, shape) -> dict[int, tuple[float, float]]:
    """step -> (predicted rollout eFLOPs, the same decoded densely), where priceable."""
    if shape is None:
        return {}
    hardware = get_hardware(arm.setting("calibrate.hardware", "h200"))
    per_prompt = int(arm.setting("rollout.samples_per_prompt", 1))
    sparse = bool(arm.setting("schedule.sparse", True))
    used = {int(b["step"]): (b["schedule_name"], b["schedule_version"]) for b in arm.bins}
    costs = {}
    for step in arm.steps:
        prompt = arm.metrics.get("rollout/prompt_tokens_mean", {}).get(step)
        length = arm.metrics.get("response/length_mean", {}).get(step)
        samples = arm.metrics.get("rollout/samples", {}).get(step)
        schedule = data.schedules.get(used.get(step)) if sparse else None
        if None in (prompt, length, samples) or (sparse and schedule is None):
            continue
        costs[step] = step_rollout_cost(
            schedule,
            model=shape,
            hardware=hardware,
            prompt_len=prompt,
            gen_len=length,
            samples_per_prompt=per_prompt,
            prompts=max(1, round(samples / per_prompt)),
        )
    return costs


def study_costs(data: StudyData) -> tuple[dict[str, dict[int, tuple[float, float]]], str]:
    """({arm: {step: (predicted eFLOPs, dense eFLOPs)}}, why there are none, or "")."""
    shape, why = model_shape_of(data)
    return {a.name: predicted_costs(a, data, shape) for a in data.arms}, why


def summarize_study(
    data: StudyData,
    window: int | None = None,
    ratio: float | None = None,
    costs: tuple[dict, str] | None = None,
) -> dict[str, Any]:
    """The summary's numbers (summary.json); window and ratio replace the study's rule."""
    rule = dataclasses.replace(
        data.study,
        collapse_window=window or data.study.collapse_window,
        collapse_ratio=ratio or data.study.collapse_ratio,
    )
    rewards = {a.name: a.series(REWARD)[1] for a in data.arms}
    labels, reference_final = collapse_labels(
        rewards, rule.reference_arm, rule.collapse_window, rule.collapse_ratio
    )
    priced, why = costs or study_costs(data)
    worst = {s.name: {a.name: worst_per_step(a.bins, s) for a in data.arms} for s in STATISTICS}
    # each sparse arm's own target (a dense arm has none)
    targets = {
        a.name: (None if a.setting("schedule.sparse") is False else a.setting("schedule.target"))
        for a in data.arms
    }
    arms = []
    for a in data.arms:
        costs = priced[a.name]
        sparse_total, dense_total = (sum(c[i] for c in costs.values()) for i in (0, 1))
        arms.append(
            {
                "arm": a.name,
                "run_id": a.run_id,
                "status": a.run.get("status"),
                "steps": len(a.steps),
                "target": a.setting("schedule.target"),
                "sparse": a.setting("schedule.sparse"),
                "collapsed": labels.get(a.name),
                "first_reward": (rewards[a.name] or [None])[0],
                "final_reward": last_mean(rewards[a.name], rule.collapse_window),
                "final_eval_accuracy": (a.series(EVAL)[1] or [None])[-1],
                "rollout_s_per_step": _mean(a.series(ROLLOUT_S)[1]),
                "tokens_per_s": _mean(a.series(TOKENS_PER_S)[1]),
                "pages_per_token": _mean(a.series(PAGES)[1]),
                "predicted_eflops_per_step": sparse_total / len(costs) if costs else None,
                "predicted_speedup": dense_total / sparse_total if costs else None,
                "worst_bin_mean": {
                    s.name: _mean(worst[s.name][a.name].values()) for s in STATISTICS
                },
                # the mean over steps of the worst counted bin's bootstrap bounds (None: rows
                # written before the bounds existed)
                "worst_bin_bounds_mean": {s.name: worst_bounds_mean(a.bins, s) for s in STATISTICS},
                "uncounted_bins": sum(b.get("counted") is False for b in a.bins),
                "estimators": sorted({b["estimator"] for b in a.bins if b.get("estimator")}),
                "overrides": a.overrides,
            }
        )
    return {
        "study_id": data.study_id,
        "workdir": data.workdir,
        "collapse_rule": {
            "reference_arm": rule.reference_arm,
            "window": rule.collapse_window,
            "ratio": rule.collapse_ratio,
            "reference_final_reward": reference_final,
        },
        "arms": arms,
        "separation": [separation(worst[s.name], labels, s) for s in STATISTICS],
        "passes_at_target": [
            passes_at_target(worst[s.name], labels, targets, s)
            for s in STATISTICS
            if s.higher_is_better
        ],
        "cost_model": {"priced": not why, "why_not": why},
    }


def _with_bounds(value: float | None, bounds: tuple | None) -> str:
    if bounds is None:
        return fmt(value)
    return f"{fmt(value)} [{fmt(bounds[0])}, {fmt(bounds[1])}]"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]


def study_markdown(summary: dict[str, Any], files: list[str]) -> str:
    rule = summary["collapse_rule"]
    if rule["reference_arm"]:
        collapse = (
            f"Collapse rule: an arm collapsed when the mean reward of its last {rule['window']} "
            f"steps is below {rule['ratio']:g} x arm `{rule['reference_arm']}`'s "
            f"({fmt(rule['reference_final_reward'])})."
        )
    else:
        collapse = "No reference arm in this study (a hold of a split seed): no collapse labels."
    lines = [
        f"# Stability study `{summary['study_id']}`",
        "",
        collapse,
        "",
        "## Arms",
        "",
    ]
    lines += _table(
        [
            "arm",
            "run",
            "status",
            "steps",
            "target",
            "first reward",
            "final reward",
            "collapsed",
            "eval acc",
            "rollout s/step",
            "tok/s",
            "pages/token",
            "pred. eFLOPs/step",
            "pred. speedup",
        ],
        [
            [
                a["arm"],
                a["run_id"],
                a["status"],
                a["steps"],
                "dense" if a["sparse"] is False else a["target"],
                a["first_reward"],
                a["final_reward"],
                a["collapsed"],
                a["final_eval_accuracy"],
                a["rollout_s_per_step"],
                a["tokens_per_s"],
                a["pages_per_token"],
                a["predicted_eflops_per_step"],
                a["predicted_speedup"],
            ]
            for a in summary["arms"]
        ],
    )
    if not summary["cost_model"]["priced"]:
        lines += ["", f"Predicted cost left out: {summary['cost_model']['why_not']}."]
    names = [s.name for s in STATISTICS]
    lines += [
        "",
        "## Worst bin per step, mean over steps",
        "",
        "Per step the worst bin among those at the floor (calibrate.min_bin_tokens and "
        "min_bin_samples); the table holds the mean of that value over the arm's steps, not "
        "every bin's value. In brackets: the mean over steps of the worst bin's 95% cluster "
        "bootstrap bounds (trajectories resampled).",
        "",
    ]
    lines += _table(
        ["arm", *names, "bins below the floor", "estimator"],
        [
            [
                a["arm"],
                *(
                    _with_bounds(a["worst_bin_mean"][n], a["worst_bin_bounds_mean"][n])
                    for n in names
                ),
                a["uncounted_bins"],
                ", ".join(a["estimators"]) or "-",
            ]
            for a in summary["arms"]
        ],
    )
    lines += [
        "",
        "## Separation of collapsed from stable arms",
        "",
        "AUC: probability that a stable arm's value beats a collapsed arm's (1 perfect, "
        "0.5 chance); per step over all steps, per arm over each arm's mean.",
        "",
    ]
    lines += _table(
        [
            "statistic",
            "better",
            "step AUC",
            "arm AUC",
            "stable arms / steps",
            "collapsed arms / steps",
        ],
        [
            [
                s["statistic"],
                "higher" if s["higher_is_better"] else "lower",
                s["step_auc"],
                s["arm_auc"],
                f"{len(s['stable_arms'])} / {s['stable_steps']}",
                f"{len(s['collapsed_arms'])} / {s['collapsed_steps']}",
            ]
            for s in summary["separation"]
        ],
    )
    dense = {a["arm"] for a in summary["arms"] if a["sparse"] is False}
    stable = {a["arm"] for a in summary["arms"] if a["collapsed"] is False}
    if stable and stable <= dense:
        lines += [
            "",
            "Every stable arm decodes densely, so these AUCs compare sparse with dense "
            "decoding, not a threshold; the table below is the test.",
        ]
    lines += [
        "",
        "## Held at each arm's target: how often the statistic calls a step fine",
        "",
        "Share of steps whose worst bin meets the arm's own target, for the sparse arms "
        "(a dense arm has no target). On collapsed arms a pass is a false pass: held at "
        "that target, the statistic would not have warned.",
        "",
    ]
    lines += _table(
        [
            "statistic",
            "collapsed arms' steps passing",
            "collapsed steps",
            "stable arms' steps passing",
            "stable steps",
        ],
        [
            [
                s["statistic"],
                s["collapsed_pass"],
                s["collapsed_steps"],
                s["stable_pass"],
                s["stable_steps"],
            ]
            for s in summary["passes_at_target"]
        ],
    )
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in files]
    return "\n".join(lines) + "\n"


def write_study_report(
    workdir: str | Path,
    study_id: str,
    out_dir: str | Path,
    window: int | None = None,
    ratio: float | None = None,
) -> tuple[list[Path], dict[str, Any]]:
    """Plots, summary.json and summary.md of the study into out_dir; (paths, summary)."""
    from sparrow.reports import study_plots

    data = load_study_data(workdir, study_id)
    costs = study_costs(data)
    summary = summarize_study(data, window, ratio, costs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = {a["arm"]: a["collapsed"] for a in summary["arms"]}
    paths = [
        study_plots.plot_reward(data, labels, out / "reward.png"),
        study_plots.plot_p5_per_bin(data, out / "p5_per_bin.png"),
        study_plots.plot_rollout_cost(data, costs[0], out / "rollout_cost.png"),
        study_plots.plot_statistics(data, labels, out / "statistics.png"),
    ]
    (out / "summary.json").write_text(json.dumps(_json_ready(summary), indent=2))
    (out / "summary.md").write_text(study_markdown(summary, [p.name for p in paths]))
    return paths + [out / "summary.json", out / "summary.md"], summary


def default_out(workdir: str | Path, study_id: str) -> Path:
    return Path(workdir) / "studies" / study_id / "report"
