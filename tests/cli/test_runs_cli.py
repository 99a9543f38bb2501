"""`sparrow runs`: runs with status and steps done, a run's recorded stages, errors.

The workdir is written with the flow's own row writers (no flow run needed).
Run: `python -m pytest tests/cli/test_runs_cli.py -q`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from sparrow.cli.main import main
from sparrow.config import load_config
from sparrow.runtime.ledger.run_record import finish_run, open_run
from sparrow.storage import Store
from sparrow.storage.run_rows import record_stage


def record(conn, run_id: str, step: int, stage: str, minute: int) -> None:
    start = datetime(2026, 1, 1, 12, minute)
    record_stage(
        conn,
        run_id,
        step,
        stage,
        start,
        start + timedelta(seconds=30),
        30.0,
        f"/w/runs/{run_id}/step-{step}/{stage}",
    )


@pytest.fixture
def workdir(tmp_path):
    store = Store.open_writer(tmp_path)
    for run_id, steps in (("done", 2), ("broken", 3)):
        open_run(
            store,
            load_config([f"pipeline.run_id={run_id}", f"pipeline.steps={steps}"]),
            run_id,
            tmp_path / "model",
        )
    with store.connect() as conn:
        minute = 0
        for step in (1, 2):
            for stage in ("rollout", "policy_update", "sync_weights"):
                record(conn, "done", step, stage, minute := minute + 1)
        record(conn, "broken", 1, "rollout", 30)
        record(conn, "broken", 1, "sync_weights", 31)
        record(conn, "broken", 2, "rollout", 32)
    finish_run(store, "done", "finished", "mlflow-7")
    store.close()  # "broken" stays marked running, and its writer is gone
    return tmp_path


def runs_json(capsys, *args) -> list[dict]:
    assert main(["runs", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_show_status_and_steps_done(workdir, capsys):
    rows = runs_json(capsys, "--workdir", str(workdir))
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["done"]["status"] == "finished" and by_id["done"]["mlflow_run_id"] == "mlflow-7"
    assert (by_id["done"]["steps_done"], by_id["done"]["steps"], by_id["done"]["stages"]) == (
        2,
        2,
        6,
    )
    assert by_id["done"]["last_stage"] == "step-2/sync_weights"
    assert by_id["broken"]["status"] == "interrupted"
    assert (by_id["broken"]["steps_done"], by_id["broken"]["steps"]) == (1, 3)
    assert by_id["broken"]["last_stage"] == "step-2/rollout"


def test_a_live_writer_keeps_a_run_running(workdir):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from sparrow.storage import Store; "
            f"s = Store.open_writer({str(workdir)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        listed = subprocess.run(
            [sys.executable, "-m", "sparrow.cli.main", "runs", "--workdir", str(workdir), "--json"],
            capture_output=True,
            text=True,
        )
    finally:
        holder.communicate("")
    statuses = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)}
    assert statuses == {"done": "finished", "broken": "running"}


def test_one_run_lists_its_stages_in_order(workdir, capsys):
    rows = runs_json(capsys, "broken", "--workdir", str(workdir))
    assert [(r["step"], r["stage"]) for r in rows] == [
        (1, "rollout"),
        (1, "sync_weights"),
        (2, "rollout"),
    ]
    assert (
        rows[0]["duration_s"] == 30.0 and rows[0]["output_dir"] == "/w/runs/broken/step-1/rollout"
    )


def test_table_output_and_errors(workdir, capsys, tmp_path):
    assert main(["runs", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "step-2/sync_weights" in out
    assert main(["runs", "nope", "--workdir", str(workdir)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: workdir {workdir} has no run 'nope'; runs: broken, done"
    )
    assert main(["runs", "--workdir", str(tmp_path / "empty")]) == 2
    assert "no mismatch history" in capsys.readouterr().err


def test_a_damaged_token_file_flags_its_step(workdir, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparrow.storage import RunLayout

    layout = RunLayout(workdir, "done")
    for step in (1, 2):
        layout.token_file(step).parent.mkdir(parents=True)
        pq.write_table(
            pa.table({"run_id": ["done"], "step": [step], "acceptance": [0.9]}),
            layout.token_file(step),
        )
    layout.token_file(2).write_bytes(b"too short")
    with Store.open_writer(workdir) as store, store.connect() as conn:
        record(conn, "done", 2, "aggregate_mismatch", 50)
    assert main(["runs", "--workdir", str(workdir), "--json"]) == 0
    captured = capsys.readouterr()
    by_id = {r["run_id"]: r for r in json.loads(captured.out)}
    assert by_id["done"]["damaged"] == "step-2" and by_id["broken"]["damaged"] is None
    assert str(layout.token_file(2)) in captured.err
    stages = runs_json(capsys, "done", "--workdir", str(workdir))
    flagged = [(r["step"], r["stage"]) for r in stages if r["damaged"]]
    assert flagged == [(2, "aggregate_mismatch")]


def test_redo_forgets_stages_and_marks_the_run_resumable(workdir, capsys):
    assert main(["runs", "redo", "done", "policy_update@2", "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert "forgot policy_update, sync_weights at step 2" in out
    assert "pipeline.run_id=done" in out
    stages = [(r["step"], r["stage"]) for r in runs_json(capsys, "done", "--workdir", str(workdir))]
    assert stages == [(1, "rollout"), (1, "policy_update"), (1, "sync_weights"), (2, "rollout")]
    [done] = [r for r in runs_json(capsys, "--workdir", str(workdir)) if r["run_id"] == "done"]
    assert (done["status"], done["steps_done"]) == ("interrupted", 1)


def test_redo_errors_are_one_line(workdir, capsys):
    for args, expected in [
        (["redo", "nope", "rollout@1"], "has no run 'nope'"),
        (["redo", "done", "rollout"], "expected STAGE@STEP"),
        (["redo", "done", "reward@1"], "no recorded stage reward at step 1"),
        (["redo", "done"], "usage: sparrow runs redo"),
    ]:
        assert main(["runs", *args, "--workdir", str(workdir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], (args, err)
