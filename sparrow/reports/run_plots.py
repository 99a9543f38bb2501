"""The report's figures (matplotlib, Agg through Figure objects: no pyplot, no global backend).

    from sparrow.reports.run import load_run, load_acceptance
    from sparrow.reports.run_plots import plot_p5
    plot_p5(load_run(workdir, run_id), Path("p5_per_bin.png"))

Each plot_* writes one PNG and returns its path; the draw_* helpers fill one Axes, so the
summary page reuses them at a smaller size. A figure with nothing to show yet (a run that
just started) says so instead of failing. Called by sparrow/reports/run.py's make_report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sparrow.mismatch.fit import TAIL_THRESHOLD

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from sparrow.reports.run import AcceptanceHistogram, RunData

DPI = 120
TARGET_STYLE = dict(color="crimson", linestyle="--", linewidth=1.2)
EVENT_STYLE = dict(marker="X", s=90, color="crimson", edgecolor="black", linewidth=0.6, zorder=5)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _empty(ax: Axes, what: str) -> None:
    ax.text(
        0.5,
        0.5,
        f"no {what} recorded yet",
        ha="center",
        va="center",
        transform=ax.transAxes,
        color="gray",
    )
    ax.set_yticks([])  # x ticks stay: a shared step axis would lose them in the other panel


def _step_axis(ax: Axes) -> None:
    """Whole-number steps on x; a run of one step gets a unit either side, not fractions."""
    low, high = ax.get_xlim()
    if high - low < 2:
        middle = round((low + high) / 2)
        ax.set_xlim(middle - 1, middle + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _bin_colors(bins: list[int]) -> dict[int, Any]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return {b: cmap(i / max(len(bins) - 1, 1) * 0.9) for i, b in enumerate(bins)}


def _per_bin(data: RunData, column: str) -> tuple[list[dict], dict[int, list[tuple]]]:
    """(the bin_stats rows with `column` set, {bin: [(step, value), ...]} in bin order)."""
    rows = [r for r in data.bins if r[column] is not None]
    series: dict[int, list[tuple]] = {}
    for r in sorted(rows, key=lambda r: r["bin"]):
        series.setdefault(r["bin"], []).append((r["step"], r[column]))
    return rows, series


def draw_p5(ax: Axes, data: RunData, legend: bool = True) -> None:
    """p5 per length bin over steps with its bootstrap band, the target as a dashed line,
    threshold events as crosses, bins below the floor as hollow circles."""
    rows, series = _per_bin(data, "p5")
    if not rows:
        _empty(ax, "bin statistics")
        return
    bins = list(series)
    colors = _bin_colors(bins)
    for b, points in series.items():
        ax.plot(
            *zip(*points),
            marker="o",
            markersize=3,
            linewidth=1.4,
            color=colors[b],
            label=data.bin_label(b),
        )
        band = [r for r in rows if r["bin"] == b and r.get("p5_lo") is not None]
        if band:
            band.sort(key=lambda r: r["step"])
            steps = [r["step"] for r in band]
            lows, highs = [r["p5_lo"] for r in band], [r["p5_hi"] for r in band]
            ax.fill_between(steps, lows, highs, color=colors[b], alpha=0.15, linewidth=0)
    thin = [r for r in rows if r.get("counted") is False]
    if thin:
        ax.scatter(
            [r["step"] for r in thin],
            [r["p5"] for r in thin],
            facecolors="none",
            edgecolors="grey",
            s=40,
            label="below the bin floor",
        )
    if data.target is not None:
        ax.axhline(data.target, **TARGET_STYLE, label=f"target {data.target:g}")
    below = [e for e in data.events if e["kind"] == "below_target" and e["p5"] is not None]
    if below:
        ax.scatter(
            [e["step"] for e in below],
            [e["p5"] for e in below],
            **EVENT_STYLE,
            label="threshold event",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("acceptance p5")
    _step_axis(ax)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            ncol=1 if len(bins) <= 12 else 2,
            frameon=False,
        )
    else:  # a small panel: the legend below it, where names cannot fall on each other
        ax.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            fontsize=7,
            ncol=3,
            frameon=False,
        )


def draw_pages_read(ax: Axes, data: RunData) -> None:
    """Pages read per step in each bin (bin_stats.pages_read) over steps, as steps."""
    rows, series = _per_bin(data, "pages_read")
    if not rows:
        _empty(ax, "budgets")
        return
    colors = _bin_colors(list(series))
    for b, points in series.items():
        ax.step(*zip(*points), where="post", color=colors[b], linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel("budget (KV pages)")
    _step_axis(ax)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def plot_p5(data: RunData, path: Path) -> Path:
    fig = Figure(figsize=(9, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2.2, 1])
    draw_p5(top, data)
    top.set_title(f"Acceptance p5 per length bin: run {data.run_id}")
    top.set_xlabel("")
    draw_pages_read(bottom, data)
    return _save(fig, path)


def draw_metric(ax: Axes, data: RunData, name: str, label: str, color: str) -> None:
    steps, values = data.series(name)
    if not steps:
        _empty(ax, name)
        return
    ax.plot(steps, values, marker="o", markersize=3, linewidth=1.6, color=color)
    ax.set_ylabel(label)
    ax.set_xlabel("step")
    _step_axis(ax)
    ax.grid(alpha=0.3)


def plot_reward_length(data: RunData, path: Path) -> Path:
    from sparrow.reports.run import LENGTH_METRIC, REWARD_METRIC

    fig = Figure(figsize=(8, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    draw_metric(top, data, REWARD_METRIC, f"reward ({REWARD_METRIC})", "tab:blue")
    top.set_title(f"Reward and response length: run {data.run_id}")
    top.set_xlabel("")
    draw_metric(bottom, data, LENGTH_METRIC, f"tokens ({LENGTH_METRIC})", "tab:orange")
    return _save(fig, path)


def draw_all_tokens(ax: Axes, hist: AcceptanceHistogram, target: float | None) -> None:
    """Every token's acceptance, log counts: the mass at 1 and the tail below it."""
    ax.bar(
        hist.edges[:-1],
        np.maximum(hist.counts, 0.8),
        width=np.diff(hist.edges),
        align="edge",
        color="tab:blue",
        alpha=0.75,
        log=True,
    )
    ax.set_ylim(bottom=0.8)
    ax.axvline(hist.p5, color="black", linewidth=1.2, label=f"p5 over all tokens {hist.p5:.3f}")
    if target is not None:
        ax.axvline(target, **TARGET_STYLE, label=f"target {target:g}")
    ax.set_xlim(0, 1)
    ax.set_xlabel("acceptance")
    ax.set_ylabel("tokens (log scale)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)


def draw_tail(ax: Axes, hist: AcceptanceHistogram) -> None:
    """The tail (acceptance < 0.999) as a density, with the fitted scaled Beta on top."""
    if hist.tail.size == 0:
        _empty(ax, "tail tokens (all accept above 0.999)")
        return
    ax.hist(
        hist.tail,
        bins=40,
        range=(0.0, TAIL_THRESHOLD),
        density=True,
        color="tab:green",
        alpha=0.6,
        label=f"tail tokens ({hist.tail_n:,} of {hist.n:,})",
    )
    fit = hist.fit
    if fit.fitted:
        from scipy import stats

        x = np.linspace(0.0, TAIL_THRESHOLD, 400)[1:-1]
        # x = acceptance / threshold ~ Beta(a, b), so the density of acceptance is scaled by 1 / threshold
        pdf = stats.beta(fit.a, fit.b).pdf(x / TAIL_THRESHOLD) / TAIL_THRESHOLD
        ax.plot(
            x,
            pdf,
            color="black",
            linewidth=1.6,
            label=f"Beta fit a={fit.a:.2f} b={fit.b:.2f}\nvar={fit.var:.3f} KS={fit.ks:.3f}",
        )
        ax.set_ylim(0, max(np.quantile(pdf, 0.98), ax.get_ylim()[1]) * 1.05)
    else:
        ax.text(
            0.02,
            0.95,
            "too few tail tokens for a Beta fit",
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            color="gray",
        )
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"acceptance (< {TAIL_THRESHOLD})")
    ax.set_ylabel("density")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)


def plot_acceptance(hist: AcceptanceHistogram, target: float | None, path: Path) -> Path:
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    draw_all_tokens(left, hist, target)
    left.set_title(f"Step {hist.step}: all {hist.n:,} tokens")
    draw_tail(right, hist)
    right.set_title(f"Step {hist.step}: the tail and its Beta fit")
    return _save(fig, path)


def _summary_lines(summary: dict[str, Any], data: RunData) -> list[str]:
    from sparrow.reports.run import fmt

    def point(p: dict | None) -> str:
        if p is None:
            return "-"
        return f"{data.bin_label(p['bin'])} at step {p['step']} (p5 {fmt(p['p5'])})"

    versions = (
        ", ".join(f"{v['name']} v{v['version']}" for v in summary["schedule_versions"]) or "-"
    )
    highlights = ", ".join(f"{k}={fmt(v)}" for k, v in summary["highlights"].items())
    return [
        f"status {fmt(summary['status'])}   steps {summary['steps']} "
        f"({fmt(summary['first_step'])}..{fmt(summary['last_step'])})   target {fmt(summary['target'])}",
        f"reward: first {fmt(summary['first_reward'])}, final {fmt(summary['final_reward'])}   "
        f"final length {fmt(summary['final_length'])}   "
        f"final lowest per-bin p5 {fmt(summary['final_min_p5'])}",
        f"worst bin at the last step: {point(summary['worst_bin'])}",
        f"lowest per-bin p5 of the run: {point(summary['lowest_p5'])}",
        f"p5 over all tokens of step {fmt(summary['acceptance_step'])} (all bins together): "
        f"{fmt(summary['acceptance_p5'])}",
        f"threshold events: {summary['threshold_events']}   schedules: {versions}",
        *_wrap(highlights, 120),
    ]


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) if text else []


def plot_summary_page(
    data: RunData, hist: AcceptanceHistogram | None, summary: dict, path: Path
) -> Path:
    """One page: the key numbers on top, then p5, reward, length and the acceptance tail."""
    return _save(summary_figure(data, hist, summary), path)


def summary_figure(data: RunData, hist: AcceptanceHistogram | None, summary: dict) -> Figure:
    """The summary page's figure (plot_summary_page saves it)."""
    from sparrow.reports.run import LENGTH_METRIC, REWARD_METRIC

    fig = Figure(figsize=(11, 12.5), layout="constrained")
    text_fig, plots_fig = fig.subfigures(2, 1, height_ratios=[1.5, 5])
    text_fig.suptitle(f"Sparrow run {data.run_id}", fontsize=15, fontweight="bold")
    text_fig.text(
        0.01,
        0.78,
        "\n".join(_summary_lines(summary, data)),
        va="top",
        ha="left",
        fontsize=9.5,
        family="monospace",
        linespacing=1.6,
    )
    axes = plots_fig.subplots(2, 2)
    draw_p5(axes[0, 0], data, legend=False)
    axes[0, 0].set_title("per-bin acceptance p5 (X: threshold event)")
    draw_metric(axes[0, 1], data, REWARD_METRIC, "reward", "tab:blue")
    axes[0, 1].set_title(REWARD_METRIC)
    draw_metric(axes[1, 0], data, LENGTH_METRIC, "tokens", "tab:orange")
    axes[1, 0].set_title(LENGTH_METRIC)
    if hist is None:
        _empty(axes[1, 1], "per-token rows")
    else:
        draw_tail(axes[1, 1], hist)
        axes[1, 1].set_title(f"acceptance tail, step {hist.step}")
    return fig
