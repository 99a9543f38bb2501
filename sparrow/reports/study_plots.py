"""The study report's figures (matplotlib Figure objects, Agg: no pyplot, no global backend).

    from sparrow.reports.study_data import load_study_data
    from sparrow.reports.study_plots import plot_reward
    plot_reward(load_study_data(workdir, "s1"), {"dense": False, "fixed": True}, Path("reward.png"))

One colour per arm throughout; collapsed arms are drawn dashed. Each plot_* writes one PNG and
returns its path; a panel with nothing recorded says so. Called by sparrow/reports/study.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from sparrow.reports.run_plots import TARGET_STYLE, _bin_colors, _empty, _step_axis

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from sparrow.reports.study_data import StudyData


# lower than a run report's: a study draws many panels, and this keeps them quick to render
DPI = 90


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _arm_colors(data: StudyData) -> dict[str, str]:
    palette = [f"C{i}" for i in range(10)]
    return {a.name: palette[i % len(palette)] for i, a in enumerate(data.arms)}


def _line(label: bool | None) -> str:
    return "--" if label else "-"


def _series_panel(
    ax: Axes, data: StudyData, name: str, ylabel: str, labels: Mapping[str, bool | None]
) -> None:
    colors, drawn = _arm_colors(data), False
    for arm in data.arms:
        steps, values = arm.series(name)
        if steps:
            ax.plot(
                steps,
                values,
                _line(labels.get(arm.name)),
                marker="o",
                markersize=3,
                color=colors[arm.name],
                label=arm.name,
            )
            drawn = True
    if not drawn:
        _empty(ax, name)
        return
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    _step_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_reward(data: StudyData, labels: Mapping[str, bool | None], path: Path) -> Path:
    """Reward per step per arm; held-out accuracy beside it when any arm evaluated."""
    evaluated = any(arm.series("eval/accuracy")[0] for arm in data.arms)
    fig = Figure(figsize=(13 if evaluated else 8, 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if evaluated else 1, squeeze=False)[0]
    _series_panel(axes[0], data, "reward/mean", "mean reward", labels)
    axes[0].set_title("reward (dashed: collapsed)")
    if evaluated:
        _series_panel(axes[1], data, "eval/accuracy", "held-out accuracy", labels)
        axes[1].set_title("evaluation (data.eval)")
    fig.suptitle(f"Study {data.study_id}: reward per step")
    return _save(fig, path)


def plot_p5_per_bin(data: StudyData, path: Path) -> Path:
    """One panel per arm: p5 of every length bin over steps, and the arm's target."""
    count = len(data.arms)
    columns = min(count, 2)
    rows = math.ceil(count / columns)
    fig = Figure(figsize=(6.5 * columns, 3.8 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, arm in zip(axes, data.arms):
        points = [b for b in arm.bins if b.get("p5") is not None]
        ax.set_title(f"{arm.name}" + ("" if arm.setting("schedule.sparse", True) else " (dense)"))
        if not points:
            _empty(ax, "bin statistics")
            continue
        bins = sorted({int(b["bin"]) for b in points})
        colors = _bin_colors(bins)
        for b in bins:
            line = [(r["step"], r["p5"]) for r in points if r["bin"] == b]
            ax.plot(
                *zip(*line),
                marker="o",
                markersize=2.5,
                linewidth=1.2,
                color=colors[b],
                label=f"bin {b}",
            )
        target = arm.setting("schedule.target")
        if target is not None and arm.setting("schedule.sparse", True):
            ax.axhline(float(target), **TARGET_STYLE, label=f"target {float(target):g}")
        ax.set_xlabel("step")
        ax.set_ylabel("acceptance p5")
        ax.set_ylim(-0.02, 1.02)  # one scale for every arm (acceptance lies in [0, 1])
        _step_axis(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(bins) > 6 else 1)
    for ax in axes[count:]:
        ax.set_visible(False)
    fig.suptitle(f"Study {data.study_id}: p5 per length bin")
    return _save(fig, path)


def plot_rollout_cost(
    data: StudyData, costs: Mapping[str, Mapping[int, tuple[float, float]]], path: Path
) -> Path:
    """Rollout seconds per step, predicted eFLOPs relative to dense, pages read per token."""
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    seconds, predicted, pages = fig.subplots(1, 3)
    _series_panel(seconds, data, "time/rollout_generate_s", "seconds", {})
    seconds.set_title("rollout time per step (measured)")
    colors, drawn = _arm_colors(data), False
    for arm in data.arms:
        points = sorted(costs.get(arm.name, {}).items())
        if points:
            predicted.plot(
                [s for s, _ in points],
                [c / d for _, (c, d) in points],
                marker="o",
                markersize=3,
                color=colors[arm.name],
                label=arm.name,
            )
            drawn = True
    if drawn:
        predicted.set_xlabel("step")
        predicted.set_ylabel("eFLOPs / dense eFLOPs")
        _step_axis(predicted)
        predicted.grid(alpha=0.3)
        predicted.legend(fontsize=8)
    else:
        _empty(predicted, "cost model prices")
    predicted.set_title("predicted rollout cost (cost model)")
    _series_panel(pages, data, "schedule/pages_read_mean", "KV pages", {})
    pages.set_title("pages read per generated token")
    fig.suptitle(f"Study {data.study_id}: rollout cost")
    return _save(fig, path)


def plot_statistics(data: StudyData, labels: Mapping[str, bool | None], path: Path) -> Path:
    """Per statistic, its worst length bin at every step, one line per arm."""
    from sparrow.experiments.study import worst_per_step
    from sparrow.reports.study import STATISTICS

    fig = Figure(figsize=(13, 7), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    colors = _arm_colors(data)
    for ax, statistic in zip(axes, STATISTICS):
        drawn = False
        for arm in data.arms:
            points = sorted(worst_per_step(arm.bins, statistic).items())
            if points:
                ax.plot(
                    *zip(*points),
                    _line(labels.get(arm.name)),
                    marker="o",
                    markersize=2.5,
                    color=colors[arm.name],
                    label=arm.name,
                )
                drawn = True
        which = "lowest" if statistic.higher_is_better else "highest"
        ax.set_title(f"{statistic.name}: {which} bin per step")
        if not drawn:
            _empty(ax, statistic.name)
            continue
        ax.set_xlabel("step")
        _step_axis(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Study {data.study_id}: tail statistics (dashed: collapsed)")
    return _save(fig, path)
