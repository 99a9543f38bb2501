"""The calibration figure: p5 of acceptance against length for every budget, the chosen
schedule on top.

    plot_calibration(table, choice, target, "calibration.png")

Top panel: one line per budget of the grid (p5 per length bin, coloured from the smallest
budget to the largest), the target as a dashed line, and the chosen schedule as black
markers at the p5 of its budget in each measured bin. Bottom panel: the chosen top-k pages
per bin, hollow where a bin had too few tokens and took its neighbour's decision. Matplotlib through Figure objects
(no pyplot, no global backend), as in sparrow/reports/run_plots.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from sparrow.control.calibration import AcceptanceTable
from sparrow.control.choose import Choice


def plot_calibration(
    table: AcceptanceTable,
    choice: Choice,
    target: float,
    path: str | Path,
    title: str = "calibration",
) -> Path:
    figure = Figure(figsize=(8, 6.5), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    starts = np.arange(table.num_bins) * table.bin_tokens
    colours = colormaps["viridis"](np.linspace(0, 1, len(table.topk_pages)))
    for j, budget in enumerate(table.topk_pages):
        top.plot(starts, table.p5[j], marker=".", color=colours[j], label=f"{budget} pages")
    top.axhline(target, color="crimson", linestyle="--", label=f"target {target}")
    chosen = [table.topk_pages.index(b.topk_pages) for b in choice.bins]
    p5 = np.array([table.p5[j, i] for i, j in enumerate(chosen)])
    own = np.array([not b.note.startswith(f"{b.tokens} tokens") for b in choice.bins])
    top.plot(starts[own], p5[own], "ks", markersize=8, label="chosen", zorder=5)
    top.set_ylabel("p5 of acceptance")
    top.set_title(title)
    top.legend(fontsize=7, ncol=2, loc="lower left")
    bottom.step(starts, choice.topk_pages, where="post", color="black")
    topk = np.array(choice.topk_pages)
    bottom.plot(starts[own], topk[own], "ks", label="measured bin")
    bottom.plot(
        starts[~own],
        topk[~own],
        "ks",
        fillstyle="none",
        label="too few tokens: neighbour's decision",
    )
    bottom.legend(fontsize=7, loc="upper left")
    bottom.set_ylabel("top-k pages")
    bottom.set_xlabel("total position (bin start, tokens)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
