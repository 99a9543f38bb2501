"""The study report from a DuckDB file written by hand: its numbers against the inserted rows
(collapse, AUC per statistic by a plain loop, the cost model's price), its files, an older
file without the newer bin_stats columns, and `sparrow study report --workdir`.

Run: `python -m pytest tests/reports/test_study.py -q`.
"""

from __future__ import annotations

import dataclasses
import json

import duckdb
import pytest

from sparrow.cli.main import main
from sparrow.config import load_config, to_yaml
from sparrow.config.study import StudyArm, StudyConfig, study_yaml
from sparrow.control.calibration import model_shape
from sparrow.costmodel import get_hardware, schedule_cost
from sparrow.model.builtin import resolve_model_path
from sparrow.reports.study import write_study_report
from sparrow.runtime.ledger.schedules import insert_schedule
from sparrow.sparse import get_preset
from sparrow.storage import Store

ARMS = {  # arm -> (overrides, rewards per step, p5 of bin 1 per step)
    "dense": (["schedule.sparse=false"], [0.5, 0.6, 0.7, 0.8], [0.99, 0.99, 0.98, 0.99]),
    "cheap": ([], [0.5, 0.4, 0.2, 0.1], [0.60, 0.55, 0.50, 0.45]),
    "ctl": (["schedule.target=0.9"], [0.5, 0.6, 0.7, 0.75], [0.88, 0.90, 0.86, 0.91]),
}
STUDY = StudyConfig(
    arms=[StudyArm(name, overrides) for name, (overrides, *_) in ARMS.items()],
    collapse_window=2,
    collapse_ratio=0.8,
)
STATS = ("p1", "p5", "p10", "mean", "min", "share_below_half")


def bin_row(p5: float) -> dict:
    """A bin's statistics built from its p5, so every column orders arms like p5 does."""
    return {
        "p1": p5 - 0.05,
        "p5": p5,
        "p10": p5 + 0.005,
        "mean": 0.99,
        "min": p5 - 0.1,
        "share_below_half": round(1 - p5, 3),
    }


def build(workdir, old_columns: bool = False, study: StudyConfig = STUDY) -> None:
    tiny = resolve_model_path("builtin:tiny")
    schedule = get_preset("tiny-0.86")
    with Store.open_writer(workdir) as store, store.connect() as conn:
        insert_schedule(conn, schedule, 1, "s-cheap", 0, "initial")
        for index, (arm, (overrides, rewards, p5s)) in enumerate(ARMS.items()):
            run_id, cfg = f"s-{arm}", load_config(overrides)
            conn.execute(
                "INSERT INTO study_arms (study_id, arm, arm_index, run_id, overrides, "
                "study_yaml) VALUES ('s', ?, ?, ?, ?, ?)",
                [arm, index, run_id, overrides, study_yaml(study)],
            )
            conn.execute(
                "INSERT INTO runs (run_id, model_path, config_yaml, status) VALUES "
                "(?, ?, ?, 'finished')",
                [run_id, str(tiny), to_yaml(cfg)],
            )
            for step, (reward, p5) in enumerate(zip(rewards, p5s), start=1):
                metrics = {
                    "reward/mean": reward,
                    "time/rollout_generate_s": 2.0 + index,
                    "rollout/prompt_tokens_mean": 40.0,
                    "response/length_mean": 200.0,
                    "rollout/samples": 16.0,
                    "schedule/pages_read_mean": 10.0,
                }
                if step % 2 == 0:
                    metrics["eval/accuracy"] = reward / 2
                for name, value in metrics.items():
                    conn.execute(
                        "INSERT INTO step_metrics VALUES (?, ?, ?, ?)", [run_id, step, name, value]
                    )
                for b, row in ((0, bin_row(0.99)), (1, bin_row(p5))):
                    conn.execute(
                        f"INSERT INTO bin_stats (run_id, step, bin, n, {', '.join(STATS)}, "
                        "schedule_name, schedule_version) VALUES (?, ?, ?, 100, ?, ?, ?, ?, ?, "
                        "?, 'tiny-0.86', 1)",
                        [run_id, step, b, *(row[s] for s in STATS)],
                    )
        if old_columns:  # as a workdir from before min and share_below_half
            conn.execute("ALTER TABLE bin_stats DROP COLUMN min")
            conn.execute("ALTER TABLE bin_stats DROP COLUMN share_below_half")


def plain_auc(stable, collapsed) -> float:
    pairs = [(s, c) for s in stable for c in collapsed]
    return sum(1.0 if s > c else 0.5 if s == c else 0.0 for s, c in pairs) / len(pairs)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("study") / "work"
    build(workdir)
    out = workdir / "report"
    paths, summary = write_study_report(workdir, "s", out)
    return workdir, out, paths, summary


def test_files_are_pngs_json_and_markdown(report):
    _, out, paths, summary = report
    assert sorted(p.name for p in paths) == sorted(
        [
            "reward.png",
            "p5_per_bin.png",
            "rollout_cost.png",
            "statistics.png",
            "summary.json",
            "summary.md",
        ]
    )
    for path in paths[:4]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    text = (out / "summary.md").read_text()
    assert "| cheap | s-cheap | finished | 4 |" in text and "![reward.png](reward.png)" in text


def test_a_hold_without_the_reference_arm_reports_no_collapse_labels(tmp_path):
    workdir = tmp_path / "work"
    build(workdir, study=dataclasses.replace(STUDY, reference_arm=""))
    _, summary = write_study_report(workdir, "s", tmp_path / "report")
    assert {a["arm"]: a["collapsed"] for a in summary["arms"]} == dict.fromkeys(ARMS)
    text = (tmp_path / "report" / "summary.md").read_text()
    assert "No reference arm in this study" in text and "x arm ``" not in text


def test_collapse_and_per_arm_numbers(report):
    _, _, _, summary = report
    assert summary["collapse_rule"]["reference_final_reward"] == pytest.approx(0.75)
    arms = {a["arm"]: a for a in summary["arms"]}
    # cheap: (0.2 + 0.1) / 2 = 0.15 < 0.8 x 0.75; ctl: 0.725 is not
    assert {a: arms[a]["collapsed"] for a in arms} == {"dense": False, "cheap": True, "ctl": False}
    assert arms["ctl"]["final_reward"] == pytest.approx(0.725)
    assert arms["ctl"]["final_eval_accuracy"] == pytest.approx(0.375)
    assert arms["ctl"]["rollout_s_per_step"] == pytest.approx(4.0)
    assert arms["cheap"]["worst_bin_mean"]["p5"] == pytest.approx(sum(ARMS["cheap"][2]) / 4)
    assert arms["cheap"]["worst_bin_mean"]["share_below_half"] == pytest.approx(
        sum(round(1 - p, 3) for p in ARMS["cheap"][2]) / 4
    )


def test_separation_per_statistic_equals_a_plain_loop(report):
    _, _, _, summary = report
    by_name = {s["statistic"]: s for s in summary["separation"]}
    assert sorted(by_name) == sorted(STATS)
    for name in STATS:

        def worst(arm):  # per step, the worst of the two bins on the higher-is-better axis
            sign = -1 if name == "share_below_half" else 1
            return [min(sign * bin_row(0.99)[name], sign * bin_row(p)[name]) for p in ARMS[arm][2]]

        stable, collapsed = worst("dense") + worst("ctl"), worst("cheap")
        assert by_name[name]["step_auc"] == pytest.approx(plain_auc(stable, collapsed)), name
        assert by_name[name]["collapsed_arms"] == ["cheap"]
    assert by_name["p5"]["step_auc"] == 1.0


def test_passes_at_each_arms_target_equal_a_plain_loop(report):
    _, out, _, summary = report
    by_name = {s["statistic"]: s for s in summary["passes_at_target"]}
    assert sorted(by_name) == sorted(s for s in STATS if s != "share_below_half")
    for name in by_name:

        def passing(arm, target):  # worst of the two bins meeting the arm's target
            return [min(bin_row(0.99)[name], bin_row(p)[name]) >= target for p in ARMS[arm][2]]

        cheap, ctl = passing("cheap", 0.86), passing("ctl", 0.9)
        assert by_name[name]["collapsed_pass"] == pytest.approx(sum(cheap) / 4), name
        assert by_name[name]["stable_pass"] == pytest.approx(sum(ctl) / 4), name
        assert (by_name[name]["collapsed_steps"], by_name[name]["stable_steps"]) == (4, 4)
    assert by_name["p5"]["stable_pass"] == 0.5  # ctl's p5 0.90 and 0.91 meet 0.9
    text = (out / "summary.md").read_text()
    assert "how often the statistic calls a step fine" in text
    assert "Every stable arm decodes densely" not in text  # ctl is a stable sparse arm


def test_a_note_when_the_only_stable_arm_is_dense(report, tmp_path):
    workdir = report[0]
    # a stricter rule collapses ctl too (0.725 < 0.99 x 0.75): dense alone is stable
    _, summary = write_study_report(workdir, "s", tmp_path / "strict", ratio=0.99)
    assert summary["separation"][0]["stable_arms"] == ["dense"]
    assert "Every stable arm decodes densely" in (tmp_path / "strict" / "summary.md").read_text()
    p5 = {s["statistic"]: s for s in summary["passes_at_target"]}["p5"]
    assert p5["stable_steps"] == 0 and p5["stable_pass"] is None


def test_predicted_cost_is_the_cost_models(report):
    _, _, _, summary = report
    arms = {a["arm"]: a for a in summary["arms"]}
    cost = schedule_cost(
        get_preset("tiny-0.86"),
        model=model_shape(resolve_model_path("builtin:tiny")),
        hardware=get_hardware("h200"),
        prompt_len=40,
        gen_len=200,
        samples=8,
        scoring="pages",
    )
    assert arms["cheap"]["predicted_eflops_per_step"] == pytest.approx(2 * cost.sparse.total)
    assert arms["cheap"]["predicted_speedup"] == pytest.approx(cost.predicted_speedup)
    assert arms["dense"]["predicted_speedup"] == pytest.approx(1.0)


def test_an_older_workdir_without_the_new_columns_still_reports(tmp_path):
    workdir = tmp_path / "old"
    build(workdir, old_columns=True)
    duckdb.connect(str(workdir / "sparrow.duckdb")).close()
    _, summary = write_study_report(workdir, "s", tmp_path / "out")
    by_name = {s["statistic"]: s for s in summary["separation"]}
    assert by_name["min"]["step_auc"] is None and by_name["p5"]["step_auc"] == 1.0


def test_cli_report_takes_the_workdir(report, tmp_path, capsys):
    workdir, _, _, summary = report
    assert (
        main(
            [
                "study",
                "report",
                "s",
                "--workdir",
                str(workdir),
                "--out",
                str(tmp_path),
                "--collapse-window",
                "4",
                "--json",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["out_dir"] == str(tmp_path) and len(printed["files"]) == 6
    # the whole run's mean: cheap 0.3 < 0.8 x dense 0.65, ctl 0.6375 is not
    assert printed["summary"]["collapse_rule"]["window"] == 4
    assert [a["collapsed"] for a in printed["summary"]["arms"]] == [False, True, False]
    assert main(["study", "report", "nope", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "no study 'nope'" in err and "studies: s" in err
