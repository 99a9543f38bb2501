"""The per-step table the train flow prints while it runs (rich, one row per step).

    table = LiveTable(Console())
    table.header()                          # at once; else the first row brings it
    table.row(step=1, metrics={"reward/mean": 0.5, ...}, resumed=False)

Columns: step, mean reward, reward calls that raised, mean response length, lowest per-bin
p5, mean KV pages read per token, rollout tokens/s, the time of the longest stages, and the
evaluation's accuracy on steps that evaluate. The header prints at once
(`header()`, before the services start, so the first minute is not silent) or with the first
row; every row is printed as it lands, so the table reads the same in a terminal and in a log.
A step whose stages were all recorded by an earlier attempt is marked "resumed".
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

# (header, step_metrics name, format)
COLUMNS = (
    ("reward", "reward/mean", "{:.3f}"),
    # reward calls that raised (each scored 0; data.reward_max_error_share stops the run)
    ("rw errors", "reward/errors", "{:.0f}"),
    ("length", "response/length_mean", "{:.1f}"),
    ("min p5", "mismatch/min_p5", "{:.3f}"),
    ("pages", "schedule/pages_read_mean", "{:.2f}"),
    ("tok/s", "rollout/tokens_per_s", "{:.0f}"),
    ("rollout s", "time/rollout_s", "{:.1f}"),
    ("reward s", "time/reward_s", "{:.1f}"),
    ("score s", "time/dense_score_s", "{:.1f}"),
    ("update s", "time/policy_update_s", "{:.1f}"),
    # the evaluate stage's mean reward ("-" on steps without evaluation; per data_source and
    # pass@k in MLflow and DuckDB's eval_results)
    ("eval", "eval/accuracy", "{:.3f}"),
)
WIDTHS = {"step": 5, "note": 8}
CELL = 9


def format_cell(value: float | None, fmt: str) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return fmt.format(value)


class LiveTable:
    def __init__(self, console: Console | None = None):
        self.console = console or Console()
        self._header_done = False

    def _table(self, header: bool) -> Table:
        table = Table(show_header=header, box=None, pad_edge=False, header_style="bold")
        table.add_column("step", justify="right", width=WIDTHS["step"])
        for name, _, _ in COLUMNS:
            table.add_column(name, justify="right", width=CELL)
        table.add_column("", justify="left", width=WIDTHS["note"])
        return table

    def header(self) -> None:
        """Print the header alone (once); the rows that follow line up under it."""
        if not self._header_done:
            self.console.print(self._table(header=True))
            self._header_done = True

    def row(self, step: int, metrics: Mapping[str, float | None], resumed: bool) -> list[str]:
        cells = [str(step)] + [format_cell(metrics.get(key), fmt) for _, key, fmt in COLUMNS]
        cells.append("resumed" if resumed else "")
        table = self._table(header=not self._header_done)
        table.add_row(*cells)
        self.console.print(table)
        self._header_done = True
        return cells
