"""make_report on a synthetic workdir: rows inserted through Store, tokens written with pyarrow.

The expected numbers come from the inserted rows with numpy (argmin, percentile, histogram),
never from the report code itself.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.config import load_config, to_yaml
from sparrow.mismatch.fit import fit_beta_tail
from sparrow.reports.run import (
    HISTOGRAM_BINS,
    ReportError,
    load_acceptance,
    load_run,
    make_report,
    summarize,
    summary_markdown,
)
from sparrow.storage import RunLayout, Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 6
BINS = 4
TOKEN_STEPS = (4, 5)


def _p5(step: int, bin: int) -> float:
    # later bins are worse; bin 3 dips below 0.86 at steps 1-2, then a bigger budget lifts it
    return 0.97 - 0.03 * bin - (0.04 if (bin == 3 and step in (1, 2)) else 0.0) + 0.002 * step


def _acceptance(step: int, n: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(step)
    tail = 0.999 * rng.beta(4.0, 1.3, n)
    return np.where(rng.random(n) < 0.3, tail, 1.0)


def build_workdir(root, run_id="r1", target=0.86):
    """A finished run of STEPS steps, plus a bare second run 'r0'."""
    rng = np.random.default_rng(0)
    rewards = np.round(0.1 + 0.08 * np.arange(STEPS) + rng.normal(0, 0.02, STEPS), 4)
    lengths = 300.0 - 20.0 * np.arange(STEPS)
    config = to_yaml(load_config([f"schedule.target={target}", "algo.lr=2e-6"]))
    with Store.open_writer(root) as store, store.connect() as conn:
        conn.execute(
            "INSERT INTO runs (run_id, model_path, config_yaml, status, mlflow_run_id) "
            "VALUES (?, 'builtin:tiny', ?, 'finished', 'mlf123'), ('r0', NULL, NULL, "
            "'failed', NULL)",
            [run_id, config],
        )
        for step in range(STEPS):
            budgets = [4, 4, 6, 8 if step < 3 else 10]
            p5s = [_p5(step, b) for b in range(BINS)]
            conn.executemany(
                "INSERT INTO step_metrics VALUES (?, ?, ?, ?)",
                [
                    (run_id, step, "reward/mean", float(rewards[step])),
                    (run_id, step, "response/length_mean", float(lengths[step])),
                    (run_id, step, "mismatch/min_p5", min(p5s)),
                ],
            )
            conn.executemany(
                "INSERT INTO bin_stats (run_id, step, bin, n, p5, pages_read, schedule_name, "
                "schedule_version) VALUES (?, ?, ?, 100, ?, ?, 'tiny-0.86', ?)",
                [(run_id, step, b, p5s[b], budgets[b], 0 if step < 3 else 1) for b in range(BINS)],
            )
            conn.executemany(
                "INSERT INTO stage_runs (run_id, step, stage, duration_s) VALUES (?, ?, ?, ?)",
                [(run_id, step, "rollout", 2.0 + step), (run_id, step, "reward", 0.5)],
            )
        conn.execute(
            "INSERT INTO threshold_events (run_id, step, bin, kind, p5, target) VALUES "
            "(?, 1, 3, 'below_target', ?, ?), (?, 2, 3, 'below_target', ?, ?)",
            [run_id, _p5(1, 3), target, run_id, _p5(2, 3), target],
        )
        conn.execute(
            "INSERT INTO schedules (name, version, run_id, step, reason, topk_pages, target, "
            "bin_tokens) VALUES ('tiny-0.86', 0, ?, 0, 'initial', [4, 4, 6, 8], ?, 1000), "
            "('tiny-0.86', 1, ?, 3, 'threshold event', [4, 4, 6, 10], ?, 1000)",
            [run_id, target, run_id, target],
        )
    layout = RunLayout(root, run_id)
    for step in TOKEN_STEPS:
        acceptance = _acceptance(step)
        path = layout.token_file(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = acceptance.size
        pq.write_table(
            pa.table(
                {
                    "run_id": [run_id] * n,
                    "step": np.full(n, step, np.int32),
                    "sample": np.arange(n, dtype=np.int32) // 500,
                    "prompt": np.zeros(n, np.int32),
                    "position": np.arange(n, dtype=np.int32),
                    "bin": (np.arange(n) // 1000).astype(np.int32),
                    "pages_read": np.full(n, 6, np.int32),
                    "acceptance": acceptance,
                    "leftover_mass": np.zeros(n),
                    "actor_logprob": np.zeros(n),
                    "dense_logprob": np.zeros(n),
                }
            ),
            path,
        )
    return {"rewards": rewards, "lengths": lengths}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("work")
    inserted = build_workdir(root)
    return root, inserted


@pytest.fixture(scope="module")
def report(workdir, tmp_path_factory):
    root, _ = workdir
    out = tmp_path_factory.mktemp("report")
    return out, make_report(root, "r1", out)


def test_report_files_are_pngs_and_markdown(report):
    out, paths = report
    names = [p.name for p in paths]
    assert names == [
        "p5_per_bin.png",
        "reward_length.png",
        f"acceptance_step{TOKEN_STEPS[-1]}.png",
        "summary.png",
        "summary.md",
    ]
    for path in paths[:-1]:
        assert path.parent == out and path.read_bytes()[:8] == PNG_MAGIC
        from matplotlib.image import imread

        pixels = imread(path)
        assert pixels.shape[0] > 300 and pixels.std() > 0.05  # drawn, not blank
    text = paths[-1].read_text()
    for name in names[:-1]:
        assert f"({name})" in text


def test_summary_numbers_equal_the_inserted_rows(workdir):
    root, inserted = workdir
    data = load_run(root, "r1")
    summary = summarize(data, load_acceptance(root, "r1"))
    last = STEPS - 1
    last_p5 = [_p5(last, b) for b in range(BINS)]
    all_p5 = np.array([[_p5(s, b) for b in range(BINS)] for s in range(STEPS)])
    low_step, low_bin = np.unravel_index(np.argmin(all_p5), all_p5.shape)
    assert summary["steps"] == STEPS and summary["last_step"] == last
    assert summary["final_reward"] == inserted["rewards"][-1]
    assert summary["first_reward"] == inserted["rewards"][0]
    assert summary["final_length"] == inserted["lengths"][-1]
    assert summary["final_min_p5"] == pytest.approx(min(last_p5))
    point = ("step", "bin", "p5")
    assert {k: summary["worst_bin"][k] for k in point} == {
        "step": last,
        "bin": int(np.argmin(last_p5)),
        "p5": pytest.approx(min(last_p5)),
    }
    assert summary["worst_bin"]["p5_lo"] is None  # rows written without bounds
    assert {k: summary["lowest_p5"][k] for k in point} == {
        "step": int(low_step),
        "bin": int(low_bin),
        "p5": pytest.approx(all_p5.min()),
    }
    assert summary["threshold_events"] == 2
    assert summary["schedule_versions"] == [
        {"name": "tiny-0.86", "version": 0, "step": 0},
        {"name": "tiny-0.86", "version": 1, "step": 3},
    ]
    assert summary["target"] == 0.86 and summary["mlflow_run_id"] == "mlf123"
    assert summary["highlights"]["algo.lr"] == pytest.approx(2e-6)
    stages = {r["stage"]: r for r in data.stages}
    assert stages["rollout"]["total_s"] == pytest.approx(sum(2.0 + s for s in range(STEPS)))


def test_summary_markdown_prints_those_numbers(report, workdir):
    _, inserted = workdir
    text = report[1][-1].read_text()
    assert f"final {inserted['rewards'][-1]:.6g}" in text
    assert f"final {inserted['lengths'][-1]:.6g}" in text
    last_p5 = [_p5(STEPS - 1, b) for b in range(BINS)]
    worst = int(np.argmin(last_p5))  # bin 3, the last: every position from 3000 on
    assert f"bin {worst} (3000+) at step {STEPS - 1}, p5 {min(last_p5):.6g}" in text
    assert f"| 2 | 3 | below_target | {_p5(2, 3):.6g} | 0.86 |" in text
    assert "| tiny-0.86 | 1 | 3 | threshold event | 4 4 6 10 |" in text
    assert "## Threshold events (2)" in text and "## Schedule versions (2)" in text


@pytest.mark.parametrize("step", [None, 4])
def test_acceptance_histogram_matches_numpy(workdir, step):
    root, _ = workdir
    hist = load_acceptance(root, "r1", step)
    expected_step = TOKEN_STEPS[-1] if step is None else step
    acceptance = _acceptance(expected_step)
    counts, edges = np.histogram(acceptance, bins=HISTOGRAM_BINS, range=(0.0, 1.0))
    assert hist.step == expected_step and hist.n == acceptance.size
    np.testing.assert_array_equal(hist.counts, counts)
    np.testing.assert_allclose(hist.edges, edges)
    assert hist.p5 == pytest.approx(np.percentile(acceptance, 5), rel=1e-12)
    assert hist.mean == pytest.approx(acceptance.mean(), rel=1e-12)
    assert hist.tail_n == int((acceptance < 0.999).sum()) == hist.tail.size
    fit = fit_beta_tail(acceptance)
    assert (hist.fit.a, hist.fit.b) == pytest.approx((fit.a, fit.b), rel=1e-4)


def test_unknown_run_lists_the_runs_present(workdir, tmp_path):
    root, _ = workdir
    with pytest.raises(ReportError, match=r"no run 'nope'.*runs: r0, r1"):
        make_report(root, "nope", tmp_path)


def test_step_without_tokens_lists_the_steps_that_have_them(workdir, tmp_path):
    root, _ = workdir
    with pytest.raises(ReportError, match=r"step 2; steps with rows: 4, 5"):
        make_report(root, "r1", tmp_path, step=2)


def test_run_with_no_steps_still_reports(workdir, tmp_path):
    root, _ = workdir
    paths = make_report(root, "r0", tmp_path)
    assert [p.name for p in paths] == [
        "p5_per_bin.png",
        "reward_length.png",
        "summary.png",
        "summary.md",
    ]
    text = paths[-1].read_text()
    assert "steps recorded: 0" in text and "status failed" in text


def test_bins_below_the_floor_are_marked_not_ranked(workdir):
    root, _ = workdir
    data = load_run(root, "r1")
    last = STEPS - 1
    last_p5 = [_p5(last, b) for b in range(BINS)]
    worst = int(np.argmin(last_p5))
    for row in data.bins:
        if row["step"] == last and row["bin"] == worst:
            row.update(counted=False)
        else:
            row.update(
                p5_lo=row["p5"] - 0.01, p5_hi=row["p5"] + 0.01, estimator="top20_lower_bound"
            )
    summary = summarize(data, None)
    second = sorted(range(BINS), key=lambda b: last_p5[b])[1]
    assert summary["worst_bin"]["bin"] == second and summary["uncounted_bins"] == 1
    assert summary["estimators"] == ["top20_lower_bound"]
    text = summary_markdown(data, summary, [])
    assert f"p5 {summary['worst_bin']['p5']:.6g} [" in text
    assert "bins below the floor (marked, not ranked): 1" in text


def test_bins_show_their_token_range_and_the_two_p5s_are_named(workdir, report):
    root, _ = workdir
    data = load_run(root, "r1")
    assert [data.bin_label(b) for b in range(BINS)] == [
        "bin 0 (0-999)",
        "bin 1 (1000-1999)",
        "bin 2 (2000-2999)",
        "bin 3 (3000+)",  # the last bin takes every position past it
    ]
    md = (report[0] / "summary.md").read_text()
    assert "lowest per-bin p5 of the run: bin 3 (3000+) at step" in md
    assert "mismatch/min_p5 (the lowest per-bin p5)" in md
    assert f"p5 over all tokens of step {TOKEN_STEPS[-1]} (every bin together" in md


def _overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of drawn, non-empty texts of `fig` whose boxes overlap (tick labels only of ticks
    inside their axis's view: matplotlib keeps the others but does not draw them)."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    ticks, drawn = set(), []
    for ax in fig.get_axes():
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update({tick.label1, tick.label2})
                if lo <= tick.get_loc() <= hi:
                    drawn += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    drawn += [t for t in fig.findobj(Text) if t not in ticks and t.get_visible()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn if t.get_text().strip()]
    return [
        (a, b)
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if box_a.overlaps(box_b)
    ]


def test_no_label_of_the_summary_page_falls_on_another(workdir):
    """Every bin at the same p5 (the common case at 0.99+): their names once sat on top of
    each other at the lines' ends."""
    import dataclasses

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sparrow.reports.run_plots import summary_figure

    root, _ = workdir
    data = load_run(root, "r1")
    flat = [dict(row, p5=0.99) for row in data.bins]
    data = dataclasses.replace(data, bins=flat)
    hist = load_acceptance(root, "r1")
    fig = summary_figure(data, hist, summarize(data, hist))
    FigureCanvasAgg(fig)
    assert _overlaps(fig) == []


def test_a_new_report_removes_the_earlier_ones_files(workdir, tmp_path):
    root, _ = workdir
    make_report(root, "r1", tmp_path, step=TOKEN_STEPS[0])
    (tmp_path / "notes.txt").write_text("mine")
    make_report(root, "r1", tmp_path, step=TOKEN_STEPS[1])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert f"acceptance_step{TOKEN_STEPS[0]}.png" not in names
    assert f"acceptance_step{TOKEN_STEPS[1]}.png" in names and "notes.txt" in names
