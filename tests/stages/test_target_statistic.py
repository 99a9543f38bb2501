"""schedule.target_statistic: which bin_stats column the controller reads, and the default p5.

The history is written into bin_stats by hand with different values per column, so a test
fails if the controller reads the wrong one; calibration's choice is checked on a table whose
p5 and min disagree. Run: `python -m pytest tests/stages/test_target_statistic.py -q`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sparrow.config import ConfigError, load_config
from sparrow.control.calibration import AcceptanceTable
from sparrow.control.controller import decide
from sparrow.model.builtin import resolve_model_path
from sparrow.sparse.schedule import Schedule
from sparrow.sparse.target import TARGET_STATISTICS, get_statistic
from sparrow.stages.calibrate_store import choose
from sparrow.stages.reoptimize_schedule import p5_history, settings_of
from sparrow.storage import Store

SCHEDULE = Schedule("ctl", (4, 8, 8), page_size=8, bin_tokens=64, skip_layers=(0,))
# (bin, p1, p5, p10, mean, min, share_below_half) at steps 1 and 2
ROWS = [
    (0, 0.80, 0.95, 0.97, 0.99, 0.30, 0.010),
    (1, 0.70, 0.80, 0.85, 0.97, 0.60, 0.000),
    (2, 0.90, 0.93, 0.95, 0.98, 0.88, 0.000),
]


def runtime_with_history(tmp_path, *overrides):
    cfg = load_config([f"pipeline.workdir={tmp_path}", *overrides])
    store = Store.open_writer(tmp_path)
    with store.connect() as conn:
        for step in (1, 2):
            for b, p1, p5, p10, mean, lowest, share in ROWS:
                conn.execute(
                    "INSERT INTO bin_stats (run_id, step, bin, n, p1, p5, p10, mean, "
                    "min, share_below_half) VALUES ('r', ?, ?, 100, ?, ?, ?, ?, ?, ?)",
                    [step, b, p1, p5, p10, mean, lowest, share],
                )
    return SimpleNamespace(cfg=cfg, run_id="r", store=store)


def test_the_default_reads_p5_exactly_as_before(tmp_path):
    runtime = runtime_with_history(tmp_path)
    try:
        assert runtime.cfg.schedule.target_statistic == "p5"
        history = p5_history(runtime, 2)
        assert history == {s: {b: p5 for b, _, p5, *_ in ROWS} for s in (1, 2)}
        settings = settings_of(runtime.cfg)
        assert settings.target == 0.86  # not re-oriented
        assert decide(history, 2, SCHEDULE, settings).raise_bins == (1,)
    finally:
        runtime.store.close()


@pytest.mark.parametrize(
    "name, target, column, raised",
    [
        ("p1", 0.75, 1, (1,)),
        ("p10", 0.96, 3, (1, 2)),
        ("mean", 0.98, 4, (1,)),
        ("min", 0.5, 5, (0,)),
        ("share_below_half", 0.005, 6, (0,)),
    ],
)
def test_the_switch_changes_the_column_the_controller_reads(tmp_path, name, target, column, raised):
    runtime = runtime_with_history(
        tmp_path, f"schedule.target_statistic={name}", f"schedule.target={target}"
    )
    try:
        history = p5_history(runtime, 2)
        statistic = get_statistic(name)
        want = {b: statistic.oriented(row[column]) for row in ROWS for b in [row[0]]}
        assert history[1] == pytest.approx(want) and history[2] == pytest.approx(want)
        settings = settings_of(runtime.cfg)
        assert settings.target == pytest.approx(statistic.oriented(target))
        assert decide(history, 2, SCHEDULE, settings).raise_bins == raised
    finally:
        runtime.store.close()


def test_share_below_half_is_lower_is_better():
    share = get_statistic("share_below_half")
    assert share.misses(0.03, 0.02) and not share.misses(0.01, 0.02)
    assert share.worst([0.0, 0.2, 0.1]) == 0.2
    p5 = get_statistic()
    assert p5.name == "p5" and p5.misses(0.85, 0.86) and not p5.misses(0.86, 0.86)
    assert p5.worst([0.9, 0.7]) == 0.7


def test_unknown_statistic_lists_the_valid_ones():
    assert TARGET_STATISTICS.names() == sorted(
        ["p1", "p5", "p10", "mean", "min", "share_below_half"]
    )
    with pytest.raises(ConfigError, match="schedule.target_statistic.*allowed: mean, min, p1"):
        load_config(["schedule.target_statistic=p50"])
    with pytest.raises(KeyError, match="valid: mean, min"):
        get_statistic("p50")


def test_calibration_chooses_on_the_target_statistic():
    topk_pages, bins = (1, 2, 4), 3
    tokens = np.full(bins, 500)
    p5 = np.full((3, bins), 0.95)  # every budget meets 0.86 on p5
    lowest = np.array([[0.2] * bins, [0.4] * bins, [0.7] * bins])  # min meets 0.5 at 4 pages
    table = AcceptanceTable(
        topk_pages,
        64,
        tokens,
        p1=p5 - 0.1,
        p5=p5,
        p10=p5,
        mean=p5,
        min=lowest,
        share_below_half=np.zeros((3, bins)),
    )
    model_dir = resolve_model_path("builtin:tiny")
    common = [
        "calibrate.min_bin_tokens=10",
        "calibrate.min_bin_samples=1",
        "schedule.name=tiny-0.86",
    ]
    by_p5 = choose(load_config(common), table, 40, model_dir)
    by_min = choose(
        load_config([*common, "schedule.target_statistic=min", "schedule.target=0.5"]),
        table,
        40,
        model_dir,
    )
    assert by_p5.topk_pages == (1, 1, 1)
    assert by_min.topk_pages == (4, 4, 4)
    old = AcceptanceTable(topk_pages, 64, tokens, p1=p5, p5=p5, p10=p5, mean=p5)  # an older table
    with pytest.raises(Exception, match="no 'min'"):
        old.statistic("min")
