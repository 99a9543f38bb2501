"""The report of one run: PNG plots and a one-page summary, from the workdir's DuckDB history.

    from sparrow.reports.run import make_report
    paths = make_report("./sparrow-work", "run-20260101-abc", "./report")   # or step=N
    paths, summary = write_report(...)        # the same, plus the summary's numbers
    # sparrow report RUN_ID [--workdir DIR] [--out DIR] [--step N] [--json]

Everything is read through sparrow.storage.report_rows (read-only, so a report can be made while
the run is still writing): runs, stage_runs, schedules, bin_stats, threshold_events and step_metrics,
and the token_mismatch view for the acceptance histogram. The names of the step metrics read
are the constants below; the train flow writes them. Plots are drawn by sparrow/reports/run_plots.py:
p5 per bin over steps against the target (threshold events marked), reward and response
length over steps, the acceptance histogram of one step with the Beta fit of its tail, and a
summary page (summary.png) beside summary.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sparrow.errors import SparrowError
from sparrow.mismatch.fit import TAIL_THRESHOLD, BetaFit, fit_beta_tail
from sparrow.storage.report_rows import acceptance_of_step, report_run_ids, run_tables, token_steps

# step_metrics names the report reads (the train flow writes them every step)
REWARD_METRIC = "reward/mean"
LENGTH_METRIC = "response/length_mean"
MIN_P5_METRIC = "mismatch/min_p5"
# config keys shown in the summary, when the runs row holds the resolved config
HIGHLIGHTS = (
    "model.path",
    "schedule.name",
    "schedule.sparse",
    "schedule.target",
    "data.train",
    "data.reward",
    "data.prompts_per_step",
    "rollout.samples_per_prompt",
    "rollout.max_new_tokens",
    "algo.advantage",
    "algo.loss",
    "algo.lr",
    "pipeline.steps",
    "pipeline.seed",
)
HISTOGRAM_BINS = 50
# tail values fitted at most; a reservoir sample keeps huge steps cheap
TAIL_SAMPLE = 200_000
_SAMPLE_SEED = 7


class ReportError(SparrowError):
    """A report that cannot be made; the message names the run or step that is missing."""


@dataclass(frozen=True)
class RunData:
    """What the report shows of one run, as plain rows (dicts) read from DuckDB."""

    run_id: str
    run: dict[str, Any]
    config: dict[str, Any]
    target: float | None
    metrics: dict[str, list[tuple[int, float]]]
    bins: list[dict[str, Any]]
    events: list[dict[str, Any]]
    schedules: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    steps: list[int] = field(default_factory=list)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        points = self.metrics.get(name, [])
        return [s for s, _ in points], [v for _, v in points]

    def bin_label(self, b: int) -> str:
        """ "bin 3 (192-255)": the bin with the token positions it covers under the run's
        newest schedule (the last bin takes every position past it: "bin 7 (448+)")."""
        known = [s for s in self.schedules if s.get("bin_tokens") and s.get("topk_pages")]
        if not known:
            return f"bin {b}"
        width, last = known[-1]["bin_tokens"], len(known[-1]["topk_pages"]) - 1
        span = f"{b * width}+" if b >= last else f"{b * width}-{(b + 1) * width - 1}"
        return f"bin {b} ({span})"


@dataclass(frozen=True)
class AcceptanceHistogram:
    """One step's acceptance: counts over [0, 1], its p5, and the Beta fit of the tail."""

    step: int
    n: int
    mean: float
    p5: float
    edges: np.ndarray
    counts: np.ndarray
    tail: np.ndarray  # values below TAIL_THRESHOLD (a sample when there are many)
    tail_n: int
    fit: BetaFit

    def __post_init__(self) -> None:
        if self.counts.shape != (self.edges.size - 1,) or int(self.counts.sum()) != self.n:
            raise ReportError(f"histogram of step {self.step}: counts do not add up to n={self.n}")


def run_ids(workdir: str | Path) -> list[str]:
    return report_run_ids(workdir)


def load_run(workdir: str | Path, run_id: str) -> RunData:
    """Every table's rows for `run_id`; ReportError listing the run ids present if it has none."""
    present = run_ids(workdir)
    if run_id not in present:
        listed = ", ".join(present) if present else "none yet"
        raise ReportError(
            f"no run {run_id!r} in {Path(workdir) / 'sparrow.duckdb'}; runs: {listed}"
        )
    tables = run_tables(workdir, run_id)
    runs, bins = tables["runs"], tables["bin_stats"]
    events, schedules, stages = (tables["threshold_events"], tables["schedules"], tables["stages"])
    run = runs[0] if runs else {"run_id": run_id}
    config = _parse_config(run.get("config_yaml"))
    metrics: dict[str, list[tuple[int, float]]] = {}
    for row in tables["step_metrics"]:
        metrics.setdefault(row["name"], []).append((row["step"], row["value"]))
    # RL steps are the ones that produced a reward or bin statistics (step 0 holds only the
    # starting schedule's record)
    trained = {s for name in (REWARD_METRIC, LENGTH_METRIC) for s, _ in metrics.get(name, [])}
    steps = sorted(trained | {b["step"] for b in bins})
    return RunData(
        run_id,
        run,
        config,
        _target(config, schedules, events),
        metrics,
        bins,
        events,
        schedules,
        stages,
        steps,
    )


def _parse_config(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def config_value(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _target(config: dict, schedules: list[dict], events: list[dict]) -> float | None:
    """The acceptance target: the run's config, else its latest schedule, else its events."""
    for value in (
        config_value(config, "schedule.target"),
        *(s["target"] for s in reversed(schedules)),
        *(e["target"] for e in events),
    ):
        if value is not None:
            return float(value)
    return None


def load_acceptance(
    workdir: str | Path, run_id: str, step: int | None = None
) -> AcceptanceHistogram | None:
    """The acceptance of one step's tokens (default: the last step with token rows).

    None when the run has no token rows at all; ReportError when `step` has none.
    """
    steps_with_rows = token_steps(workdir, run_id)
    if not steps_with_rows:
        if step is None:
            return None
        raise ReportError(f"run {run_id!r} has no per-token rows (token_mismatch) for any step")
    if step is None:
        step = steps_with_rows[-1]
    elif step not in steps_with_rows:
        raise ReportError(
            f"run {run_id!r} has no per-token rows for step {step}; "
            f"steps with rows: {', '.join(map(str, steps_with_rows))}"
        )
    totals, by_bin, sampled = acceptance_of_step(
        workdir,
        run_id,
        step,
        bins=HISTOGRAM_BINS,
        below=TAIL_THRESHOLD,
        sample=TAIL_SAMPLE,
        seed=_SAMPLE_SEED,
    )
    counts = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
    for b, n in by_bin.items():
        counts[b] = n
    tail = np.array(sampled, dtype=np.float64)
    return AcceptanceHistogram(
        step=int(step),
        n=int(totals["n"]),
        mean=float(totals["mean"]),
        p5=float(totals["p5"]),
        edges=np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1),
        counts=counts,
        tail=tail,
        tail_n=int(totals["tail_n"]),
        fit=fit_beta_tail(tail),
    )


def summarize(data: RunData, hist: AcceptanceHistogram | None) -> dict[str, Any]:
    """The numbers of the summary page, as one flat-ish dict (also what --json prints)."""
    last_step = data.steps[-1] if data.steps else None
    final = {name: points[-1] for name, points in data.metrics.items()}
    # bins below the floor (counted false) are marked, not ranked; rows from before it count
    counted = [b for b in data.bins if b["p5"] is not None and b.get("counted") is not False]
    last_bins = [b for b in counted if b["step"] == last_step]
    worst = min(last_bins, key=lambda b: b["p5"], default=None)
    lowest = min(counted, key=lambda b: b["p5"], default=None)
    return {
        "run_id": data.run_id,
        "status": data.run.get("status"),
        "mlflow_run_id": data.run.get("mlflow_run_id"),
        "steps": len(data.steps),
        "first_step": data.steps[0] if data.steps else None,
        "last_step": last_step,
        "target": data.target,
        "first_reward": data.metrics[REWARD_METRIC][0][1]
        if REWARD_METRIC in data.metrics
        else None,
        "final_reward": final[REWARD_METRIC][1] if REWARD_METRIC in final else None,
        "final_length": final[LENGTH_METRIC][1] if LENGTH_METRIC in final else None,
        "final_min_p5": final[MIN_P5_METRIC][1] if MIN_P5_METRIC in final else None,
        "worst_bin": _bin_point(worst),
        "lowest_p5": _bin_point(lowest),
        "uncounted_bins": sum(b.get("counted") is False for b in data.bins),
        "estimators": sorted({b["estimator"] for b in data.bins if b.get("estimator")}),
        "threshold_events": len(data.events),
        "schedule_versions": [
            {"name": s["name"], "version": s["version"], "step": s["step"]} for s in data.schedules
        ],
        "acceptance_step": hist.step if hist else None,
        "acceptance_p5": hist.p5 if hist else None,
        "highlights": {
            k: config_value(data.config, k)
            for k in HIGHLIGHTS
            if config_value(data.config, k) is not None
        },
    }


def _bin_point(row: dict | None) -> dict | None:
    if row is None:
        return None
    keys = ("step", "bin", "p5", "p5_lo", "p5_hi", "samples", "estimator")
    return {k: row.get(k) for k in keys}


def interval(point: dict) -> str:
    """ "p5 0.91 [0.88, 0.93]": the value and its bootstrap bounds where stored."""
    bounds = ""
    if point.get("p5_lo") is not None:
        bounds = f" [{fmt(point['p5_lo'])}, {fmt(point['p5_hi'])}]"
    return f"p5 {fmt(point['p5'])}{bounds}"


def fmt(value: Any) -> str:
    """Numbers as the summary prints them: 6 significant digits, "-" for missing."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return ["(none)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]


def summary_markdown(data: RunData, summary: dict[str, Any], files: list[str]) -> str:
    s = summary
    lines = [
        f"# Sparrow run `{data.run_id}`",
        "",
        f"status {fmt(s['status'])}, MLflow run {fmt(s['mlflow_run_id'])}, "
        f"model {fmt(data.run.get('model_path'))}",
        "",
        "## Config highlights",
        "",
    ]
    lines += _table(["key", "value"], [[k, v] for k, v in s["highlights"].items()])
    lines += [
        "",
        "## Steps",
        "",
        f"- steps recorded: {s['steps']} (from {fmt(s['first_step'])} to {fmt(s['last_step'])})",
        f"- {REWARD_METRIC}: first {fmt(s['first_reward'])}, final {fmt(s['final_reward'])}",
        f"- {LENGTH_METRIC}: final {fmt(s['final_length'])}",
        f"- {MIN_P5_METRIC} (the lowest per-bin p5): final {fmt(s['final_min_p5'])} "
        f"(target {fmt(s['target'])})",
    ]
    for key, label in (
        ("worst_bin", "worst bin at the last step (per-bin p5)"),
        ("lowest_p5", "lowest per-bin p5 of the run"),
    ):
        point = s[key]
        lines.append(
            f"- {label}: "
            + (
                "-"
                if point is None
                else f"{data.bin_label(point['bin'])} at step {point['step']}, {interval(point)}"
            )
        )
    lines.append(
        f"- bins below the floor (marked, not ranked): {s['uncounted_bins']}; acceptance "
        f"estimator: {', '.join(s['estimators']) or '-'} (p5 [low, high]: the 95% cluster "
        "bootstrap over trajectories)"
    )
    if s["acceptance_step"] is not None:
        lines.append(
            f"- p5 over all tokens of step {s['acceptance_step']} (every bin together, so the "
            f"many tokens of the early bins weigh most): {fmt(s['acceptance_p5'])}"
        )
    lines += ["", f"## Threshold events ({len(data.events)})", ""]
    lines += _table(
        ["step", "bin", "kind", "p5", "target", "estimator"],
        [
            [e["step"], e["bin"], e["kind"], e["p5"], e["target"], e.get("estimator")]
            for e in data.events
        ],
    )
    lines += ["", f"## Schedule versions ({len(data.schedules)})", ""]
    lines += _table(
        ["name", "version", "step", "reason", "topk_pages"],
        [
            [r["name"], r["version"], r["step"], r["reason"], r["topk_pages"]]
            for r in data.schedules
        ],
    )
    lines += ["", "## Stage times", ""]
    lines += _table(
        ["stage", "steps", "total s", "mean s"],
        [[r["stage"], r["steps"], r["total_s"], r["mean_s"]] for r in data.stages],
    )
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in files]
    return "\n".join(lines) + "\n"


def make_report(
    workdir: str | Path, run_id: str, out_dir: str | Path, step: int | None = None
) -> list[Path]:
    """Write the plots, summary.png and summary.md for `run_id` into `out_dir`; their paths."""
    return write_report(workdir, run_id, out_dir, step)[0]


def write_report(
    workdir: str | Path, run_id: str, out_dir: str | Path, step: int | None = None
) -> tuple[list[Path], dict[str, Any]]:
    """make_report, also returning the summary's numbers (what `sparrow report --json` prints)."""
    from sparrow.reports import run_plots

    data = load_run(workdir, run_id)
    hist = load_acceptance(workdir, run_id, step)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_earlier_report(out)
    paths = [
        run_plots.plot_p5(data, out / "p5_per_bin.png"),
        run_plots.plot_reward_length(data, out / "reward_length.png"),
    ]
    if hist is not None:
        paths.append(
            run_plots.plot_acceptance(hist, data.target, out / f"acceptance_step{hist.step}.png")
        )
    summary = summarize(data, hist)
    paths.append(run_plots.plot_summary_page(data, hist, summary, out / "summary.png"))
    md = out / "summary.md"
    md.write_text(summary_markdown(data, summary, [p.name for p in paths]))
    return paths + [md], summary


# the files a report writes (acceptance_step<N>.png names its step)
REPORT_FILES = (
    "p5_per_bin.png",
    "reward_length.png",
    "acceptance_step*.png",
    "summary.png",
    "summary.md",
)


def remove_earlier_report(out: Path) -> list[Path]:
    """Delete an earlier report's files in `out` (another step's histogram would stay beside
    the new one); any other file there is left alone."""
    stale = sorted({p for pattern in REPORT_FILES for p in out.glob(pattern) if p.is_file()})
    for path in stale:
        path.unlink()
    return stale
