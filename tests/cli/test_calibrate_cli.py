"""`sparrow calibrate`: bad input is one line before anything starts; the summary printout."""

from __future__ import annotations

import subprocess
import sys

from sparrow.cli.commands.calibrate import print_summary
from sparrow.cli.main import build_parser


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_calibrate_is_a_command():
    args = build_parser().parse_args(["calibrate", "calibrate.repeats=2", "--json"])
    assert args.overrides == ["calibrate.repeats=2"] and args.json


def test_a_bad_key_is_one_line_and_exit_2():
    result = run_cli("calibrate", "calibrate.repeets=2")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "calibrate.repeets" in result.stderr


def test_a_bad_topk_grid_names_the_key():
    result = run_cli("calibrate", "calibrate.topk_pages=[8,4]")
    assert result.returncode == 2 and "calibrate.topk_pages" in result.stderr


def test_summary_names_times_notes_and_how_to_train(capsys):
    summary = {
        "schedule": "tiny-cal",
        "version": 2,
        "target": 0.86,
        "topk_pages": [6, 12],
        "tokens_per_bin": [0, 300],
        "notes": ["bin 0: 0 tokens; takes bin 1's decision"],
        "calibration_s": 30.0,
        "sample_s": 20.0,
        "replay_s": 10.0,
        "topk_grid": [2, 6, 12],
        "generation_s": 90.0,
        "generation_over_calibration": 3.0,
        "yaml": "/w/s.yaml",
        "plot": "/w/p.png",
    }
    print_summary(summary)
    out = capsys.readouterr().out
    assert "tiny-cal v2" in out and "takes bin 1's decision" in out
    assert "30.0 s" in out and "90.0 s (3.0x)" in out
    assert "sparrow train schedule.name=tiny-cal" in out


def test_schedule_show_reads_stored_versions_from_a_workdir(tmp_path):
    import json

    from sparrow.runtime.ledger.schedules import insert_schedule
    from sparrow.sparse.presets import get_preset
    from sparrow.storage import Store

    base = get_preset("tiny-0.86")
    first = base.__class__(**{**base.__dict__, "name": "cal-x", "topk_pages": (6,) * 8})
    second = base.__class__(
        **{**base.__dict__, "name": "cal-x", "topk_pages": (6, 6, 12) + (12,) * 5}
    )
    with Store.open_writer(tmp_path) as store, store.connect() as conn:
        insert_schedule(conn, first, 1, "cal-1", 0, "calibration cal-1")
        insert_schedule(conn, second, 2, "r1", 4, "bin 2 raise 6->12")
    newest = run_cli("schedule", "show", "cal-x", "--workdir", str(tmp_path), "--json")
    assert newest.returncode == 0, newest.stderr
    assert json.loads(newest.stdout)["topk_pages"] == [6, 6] + [12] * 6
    old = run_cli("schedule", "show", "cal-x@1", "--workdir", str(tmp_path), "--json")
    assert json.loads(old.stdout)["topk_pages"] == [6] * 8
    assert "version 1" in json.loads(old.stdout)["description"]
    missing = run_cli("schedule", "show", "cal-x@9", "--workdir", str(tmp_path))
    assert missing.returncode == 2 and "no version 9" in missing.stderr
