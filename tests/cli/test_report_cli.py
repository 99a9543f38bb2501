"""`sparrow report` on a small synthetic workdir: printed paths, --json numbers, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparrow.cli.main import main
from sparrow.storage import RunLayout, Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REWARDS = [0.25, 0.375, 0.5]
P5 = {(0, 0): 0.95, (0, 1): 0.88, (1, 0): 0.96, (1, 1): 0.84, (2, 0): 0.97, (2, 1): 0.87}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("work")
    with Store.open_writer(root) as store, store.connect() as conn:
        conn.execute("INSERT INTO runs (run_id, status) VALUES ('cli-run', 'finished')")
        conn.executemany(
            "INSERT INTO step_metrics VALUES ('cli-run', ?, 'reward/mean', ?)",
            list(enumerate(REWARDS)),
        )
        conn.executemany(
            "INSERT INTO bin_stats (run_id, step, bin, p5) VALUES ('cli-run', ?, ?, ?)",
            [(s, b, p5) for (s, b), p5 in P5.items()],
        )
        conn.execute(
            "INSERT INTO threshold_events (run_id, step, bin, kind, p5, target) "
            "VALUES ('cli-run', 1, 1, 'below_target', 0.84, 0.86)"
        )
    acceptance = np.concatenate([np.linspace(0.05, 0.99, 300), np.ones(700)])
    path = RunLayout(root, "cli-run").token_file(2)
    path.parent.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "run_id": ["cli-run"] * acceptance.size,
                "step": np.full(acceptance.size, 2, np.int32),
                "acceptance": acceptance,
            }
        ),
        path,
    )
    return root, acceptance


def test_prints_the_paths_into_the_default_folder(workdir, capsys):
    root, _ = workdir
    assert main(["report", "cli-run", "--workdir", str(root)]) == 0
    printed = [Path(line) for line in capsys.readouterr().out.splitlines()]
    folder = root / "reports" / "cli-run"
    assert [p.name for p in printed] == [
        "p5_per_bin.png",
        "reward_length.png",
        "acceptance_step2.png",
        "summary.png",
        "summary.md",
    ]
    assert all(p.parent == folder and p.is_file() for p in printed)
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in printed if p.suffix == ".png")


def test_json_holds_files_and_the_inserted_numbers(workdir, tmp_path, capsys):
    root, acceptance = workdir
    assert (
        main(["report", "cli-run", "--workdir", str(root), "--out", str(tmp_path), "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["out_dir"] == str(tmp_path)
    assert all(Path(f).is_file() and Path(f).parent == tmp_path for f in data["files"])
    summary = data["summary"]
    assert summary["final_reward"] == REWARDS[-1] and summary["first_reward"] == REWARDS[0]
    assert summary["steps"] == 3 and summary["threshold_events"] == 1
    worst_last = min((p5, b) for (s, b), p5 in P5.items() if s == 2)
    worst = summary["worst_bin"]
    assert {k: worst[k] for k in ("step", "bin", "p5")} == {
        "step": 2,
        "bin": worst_last[1],
        "p5": worst_last[0],
    }
    # the bin's bootstrap bounds, trajectories and estimator ride along (NULL for rows of a
    # store that predates them)
    assert {"p5_lo", "p5_hi", "samples", "estimator"} <= set(worst)
    lowest = summary["lowest_p5"]
    assert {k: lowest[k] for k in ("step", "bin", "p5")} == {"step": 1, "bin": 1, "p5": 0.84}
    assert summary["target"] == 0.86  # no config: taken from the threshold event
    assert summary["acceptance_step"] == 2
    assert summary["acceptance_p5"] == pytest.approx(np.percentile(acceptance, 5))
    assert summary["final_length"] is None  # never written, so absent rather than invented


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_unknown_run_is_one_line_listing_the_runs(workdir, tmp_path, capsys):
    root, _ = workdir
    assert main(["report", "missing", "--workdir", str(root), "--out", str(tmp_path)]) == 2
    assert "no run 'missing'" in _one_line_error(capsys)
    assert main(["report", "missing", "--workdir", str(root), "--out", str(tmp_path)]) == 2
    assert _one_line_error(capsys).endswith("runs: cli-run")


def test_step_without_tokens_and_missing_workdir(workdir, tmp_path, capsys):
    root, _ = workdir
    assert (
        main(["report", "cli-run", "--workdir", str(root), "--out", str(tmp_path), "--step", "0"])
        == 2
    )
    assert "steps with rows: 2" in _one_line_error(capsys)
    assert main(["report", "cli-run", "--workdir", str(tmp_path / "nowhere")]) == 2
    assert "no mismatch history" in _one_line_error(capsys)
