"""Tracker against a real MLflow sqlite store in a temporary workdir, read back with MlflowClient.

One store is shared by the module (making an MLflow sqlite database takes seconds); each test
uses its own Sparrow run id, so each gets its own MLflow run.
"""

from __future__ import annotations

import math

import pytest
import yaml

from sparrow.config import load_config, to_yaml
from sparrow.runtime.tracking import Tracker, TrackingError, flatten_config
from sparrow.sparse.schedule import Schedule

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def cfg():
    return load_config(["algo.lr=3e-6", "pipeline.steps=5"])


def _client(workdir):
    return mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")


def _artifact_text(client, run_id, path, tmp_path):
    local = client.download_artifacts(run_id, path, str(tmp_path))
    with open(local) as f:
        return f.read()


def test_start_makes_tagged_run_with_config_and_params(workdir, cfg, tmp_path, capfd):
    tracker = Tracker.start(cfg, "run-a", workdir)
    out, err = capfd.readouterr()
    assert out == ""
    assert "INFO" not in err  # no MLflow database banners
    assert (workdir / "mlflow.db").is_file()
    client = _client(workdir)
    run = client.get_run(tracker.mlflow_run_id)
    assert run.data.tags["sparrow.run_id"] == "run-a"
    assert run.info.status == "RUNNING"
    assert run.info.artifact_uri.startswith((workdir / "mlartifacts").as_uri())
    # params: every leaf of the config under its dotted name
    assert run.data.params["algo.lr"] == "3e-06"
    assert run.data.params["pipeline.steps"] == "5"
    assert run.data.params["rollout.samples_per_prompt"] == str(cfg.rollout.samples_per_prompt)
    assert run.data.params["algo.distill.lora_rank"] == str(cfg.algo.distill.lora_rank)
    assert len(run.data.params) == len(flatten_config(cfg))
    logged = yaml.safe_load(_artifact_text(client, tracker.mlflow_run_id, "config.yaml", tmp_path))
    assert logged == yaml.safe_load(to_yaml(cfg))
    assert logged["algo"]["lr"] == pytest.approx(3e-6)


def test_reward_patterns_are_one_param(workdir):
    """data.reward_by_source's keys are fnmatch patterns ("chase/*"), which MLflow refuses in
    a param's name: the mapping is logged as one param."""
    cfg = load_config(['data.reward_by_source={"chase/*": exact_match, "a b": math}'])
    tracker = Tracker.start(cfg, "run-patterns", workdir)
    params = _client(workdir).get_run(tracker.mlflow_run_id).data.params
    assert params["data.reward_by_source"] == "{'chase/*': 'exact_match', 'a b': 'math'}"
    assert not [k for k in params if k.startswith("data.reward_by_source.")]


def test_log_step_metrics_read_back(workdir, cfg):
    tracker = Tracker.start(cfg, "run-metrics", workdir)
    rewards = [0.125, 0.25, float("nan")]
    for step, reward in enumerate(rewards):
        tracker.log_step(
            step,
            {
                "reward/mean": reward,
                "mismatch/p5_bin_3": 0.9 - 0.01 * step,
                "time/rollout_s": 2.0 * step,
                "loss/kl": None,
            },
        )
    client = _client(workdir)
    history = sorted(
        client.get_metric_history(tracker.mlflow_run_id, "reward/mean"), key=lambda m: m.step
    )
    assert [m.step for m in history] == [0, 1, 2]
    assert [m.value for m in history[:2]] == rewards[:2]
    assert math.isnan(history[2].value)
    p5 = sorted(
        client.get_metric_history(tracker.mlflow_run_id, "mismatch/p5_bin_3"), key=lambda m: m.step
    )
    assert [m.value for m in p5] == pytest.approx([0.9, 0.89, 0.88])
    assert "loss/kl" not in client.get_run(tracker.mlflow_run_id).data.metrics


def test_resume_same_run_id_logs_into_same_mlflow_run(workdir, cfg, tmp_path):
    first = Tracker.start(load_config(["pipeline.fail_at=reward@1"]), "run-resume", workdir)
    first.log_step(0, {"reward/mean": 0.5})
    first.end("failed")
    client = _client(workdir)
    assert client.get_run(first.mlflow_run_id).info.status == "FAILED"

    second = Tracker.start(cfg, "run-resume", workdir)
    assert second.resumed and not first.resumed
    assert second.mlflow_run_id == first.mlflow_run_id
    second.log_step(1, {"reward/mean": 0.75})
    second.end("finished")
    run = client.get_run(first.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["sparrow.resumes"] == "1"
    # params stay those of the first start; the changed config is kept beside them
    assert run.data.params["pipeline.fail_at"] == "reward@1"
    resumed = yaml.safe_load(
        _artifact_text(client, first.mlflow_run_id, "config-resume-1.yaml", tmp_path)
    )
    assert resumed["pipeline"]["fail_at"] == ""
    history = sorted(
        client.get_metric_history(first.mlflow_run_id, "reward/mean"), key=lambda m: m.step
    )
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.75)]
    tagged = client.search_runs([run.info.experiment_id], "tags.`sparrow.run_id` = 'run-resume'")
    assert len(tagged) == 1

    other = Tracker.start(cfg, "run-other", workdir)
    assert other.mlflow_run_id != first.mlflow_run_id and not other.resumed


def test_threshold_event_metric_and_tag(workdir, cfg):
    tracker = Tracker.start(cfg, "run-threshold", workdir)
    tracker.log_threshold_event(step=4, bin=2, p5=0.8125, target=0.86)
    client = _client(workdir)
    run = client.get_run(tracker.mlflow_run_id)
    assert float(run.data.tags["threshold.step4.bin2"]) == 0.8125
    below = client.get_metric_history(tracker.mlflow_run_id, "threshold/below_target")
    assert [(m.step, m.value) for m in below] == [(4, 1.0)]
    p5 = client.get_metric_history(tracker.mlflow_run_id, "threshold/p5_bin_2")
    assert [(m.step, m.value) for m in p5] == [(4, 0.8125)]


def test_schedule_and_artifacts(workdir, cfg, tmp_path):
    tracker = Tracker.start(cfg, "run-schedule", workdir)
    schedule = Schedule(name="tiny-test", topk_pages=(4, 6, 6), skip_layers=(0,), target=0.9)
    artifact = tracker.log_schedule(schedule, version=3, step=7)
    assert artifact == "schedules/tiny-test-v3.yaml"
    client = _client(workdir)
    data = yaml.safe_load(_artifact_text(client, tracker.mlflow_run_id, artifact, tmp_path / "s"))
    assert data["topk_pages"] == [4, 6, 6] and data["skip_layers"] == [0]
    assert (data["version"], data["step"], data["target"]) == (3, 7, 0.9)
    tags = client.get_run(tracker.mlflow_run_id).data.tags
    assert (tags["sparrow.schedule"], tags["sparrow.schedule_version"]) == ("tiny-test", "3")

    plot = tmp_path / "p5.png"
    plot.write_bytes(b"\x89PNG fake")
    folder = tmp_path / "stats"
    folder.mkdir()
    (folder / "bin_stats.csv").write_text("step,bin,p5\n0,0,0.9\n")
    tracker.log_artifact(plot, subdir="plots")
    tracker.log_artifact(folder, subdir="bins")
    names = {a.path for a in client.list_artifacts(tracker.mlflow_run_id, "plots")}
    names |= {a.path for a in client.list_artifacts(tracker.mlflow_run_id, "bins")}
    assert names == {"plots/p5.png", "bins/bin_stats.csv"}
    with pytest.raises(TrackingError, match="does not exist"):
        tracker.log_artifact(tmp_path / "missing.png")


@pytest.mark.slow  # a second sqlite store: MLflow's table set-up takes seconds
def test_custom_sqlite_uri_keeps_artifacts_in_the_workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's own default would be ./mlruns here
    uri = f"sqlite:///{tmp_path}/elsewhere.db"
    tracker = Tracker.start(
        load_config([f"pipeline.mlflow_uri={uri}"]), "run-uri", tmp_path / "work"
    )
    tracker.log_step(0, {"reward/mean": 1.0})
    assert (tmp_path / "elsewhere.db").is_file()
    assert not (tmp_path / "work" / "mlflow.db").exists()
    assert not (tmp_path / "mlruns").exists()
    run = mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(tracker.mlflow_run_id)
    assert run.data.tags["sparrow.run_id"] == "run-uri"
    assert run.info.artifact_uri.startswith((tmp_path / "work" / "mlartifacts").as_uri())
    assert run.data.metrics["reward/mean"] == 1.0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: t.log_step(0, {"reward/mean": "high"}), "'reward/mean' must be a number"),
        (lambda t: t.log_step(-1, {"reward/mean": 1.0}), "step must be an integer >= 0"),
        (lambda t: t.log_step(0, {"bad:name?": 1.0}), "MLflow refused"),
        (lambda t: t.log_threshold_event(0, -2, 0.5, 0.86), "bin must be an integer >= 0"),
        (lambda t: t.end("done"), "'done' is not one of"),
    ],
)
def test_bad_input_is_one_named_error(workdir, cfg, call, message):
    tracker = Tracker.start(cfg, "run-bad", workdir)
    with pytest.raises(TrackingError, match=message):
        call(tracker)


def test_run_id_with_quote_refused(workdir, cfg):
    with pytest.raises(TrackingError, match="run id"):
        Tracker.start(cfg, "it's", workdir)


def test_the_library_never_imports_mlflow():
    import re
    from pathlib import Path

    import sparrow

    pattern = re.compile(r"^\s*(import|from)\s+mlflow\b", re.MULTILINE)
    root = Path(sparrow.__file__).parent
    system = {"runtime", "stages", "flows", "cli"}  # the roles that may track
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.relative_to(root).parts[0] not in system and pattern.search(p.read_text())
    ]
    assert offenders == []
    assert pattern.search((root / "runtime" / "tracking.py").read_text())


# one process of the two-process test: waits until both have imported MLflow, then starts
_CHILD = """
import sys, time
from pathlib import Path
from sparrow.config import load_config
from sparrow.runtime.tracking import Tracker
import mlflow.tracking
workdir, run_id, barrier = sys.argv[1:4]
Path(barrier, run_id).touch()
while len(list(Path(barrier).iterdir())) < 2:
    time.sleep(0.01)
print(Tracker.start(load_config([]), run_id, workdir).mlflow_run_id)
"""


def test_two_processes_open_a_new_store_at_once(tmp_path):
    """Two calibrations in one fresh workdir: both make their MLflow runs (MLflow creates its
    tables on first use; without the lock one of them fails with "table already exists")."""
    import subprocess
    import sys

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path / "work"), name, str(barrier)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("cal-a", "cal-b")
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 2
    tags = {
        r.data.tags["sparrow.run_id"]
        for r in _client(tmp_path / "work").search_runs(
            [e.experiment_id for e in _client(tmp_path / "work").search_experiments()]
        )
    }
    assert tags == {"cal-a", "cal-b"}


# a process killed while MLflow creates its tables: once a migration has recorded itself
# (alembic_version), it dies at the first CREATE TABLE that follows another one, so a later
# migration that makes two tables has made its first and not yet recorded itself
_KILLED_CHILD = """
import os, sys
import sqlalchemy
from sqlalchemy import event
from sparrow.config import load_config
from sparrow.runtime.tracking import Tracker
workdir = sys.argv[1]
last = [""]
migrated = [False]
@event.listens_for(sqlalchemy.engine.Engine, "before_cursor_execute")
def die_midway(conn, cursor, statement, *args):
    now = statement.lstrip().upper()
    migrated[0] = migrated[0] or now.startswith("UPDATE ALEMBIC_VERSION")
    if migrated[0] and now.startswith("CREATE TABLE") and last[0].startswith("CREATE TABLE"):
        os._exit(9)
    last[0] = now
Tracker.start(load_config([]), "k", workdir)
"""


def test_a_process_killed_while_the_store_is_made_leaves_a_store_that_opens(tmp_path, cfg):
    """kill -9 while MLflow makes its SQLite tables (a run's first seconds): the next process
    opens the store and makes its run. The store is made under another name and renamed
    into place whole, so a half-made one (which fails with "table ... already exists" on every
    later open) never stands at the store's path."""
    import os
    import subprocess
    import sys

    work = tmp_path / "work"
    # no kept empty store to copy: MLflow makes this one by its migrations
    env = dict(os.environ, SPARROW_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, str(work)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 9, done.stderr[-2000:]
    tracker = Tracker.start(cfg, "k", work)
    assert not tracker.resumed
    assert [p.name for p in work.iterdir() if p.name.startswith(".mlflow.db")] == []


def test_a_damaged_store_is_one_named_error(tmp_path, cfg):
    work = tmp_path / "work"
    work.mkdir()
    (work / "mlflow.db").write_bytes(b"not a database" * 400)
    with pytest.raises(TrackingError, match=r"mlflow\.db cannot be used .*move it aside"):
        Tracker.start(cfg, "k", work)
    assert (work / "mlflow.db").read_bytes() == b"not a database" * 400  # left as it was


def _store_contents(path):
    """(schema, experiments without their times, alembic version) of a SQLite store."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path)) as conn:
        # a table's clauses as a sorted list: MLflow's migrations write some constraints in
        # an order that differs from one store it makes to the next
        schema = sorted(
            (kind, name, sorted(part.strip() for part in (sql or "").split(",")))
            for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master")
        )
        experiments = conn.execute(
            "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"
        ).fetchall()
        times = conn.execute("SELECT creation_time, last_update_time FROM experiments").fetchall()
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    return schema, experiments, version, times


def test_a_new_store_is_a_copy_of_the_kept_empty_one_and_equals_a_made_one(tmp_path, monkeypatch):
    """The first store MLflow makes is kept; later ones are copies of it, made without MLflow,
    equal to a store MLflow makes (tables, version, the Default experiment's location) and
    stamped with their own time."""
    import time

    from sparrow.runtime import tracking

    monkeypatch.setenv("SPARROW_CACHE_DIR", str(tmp_path / "cache"))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "a")
    tracking._make_sqlite_whole(f"sqlite:///{tmp_path / 'first.db'}")
    template = tracking._store_template()
    assert template.is_file() and template.name == f"mlflow-{mlflow.__version__}-empty.db"
    # another directory: MLflow puts the Default experiment's artifacts under the process's
    monkeypatch.chdir(tmp_path / "b")
    made, copied = tmp_path / "made.db", tmp_path / "copied.db"
    mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()

    def refused(*args, **kwargs):
        raise AssertionError("a kept empty store was there to copy")

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", refused)
    before = int(time.time() * 1000)
    tracking._make_sqlite_whole(f"sqlite:///{copied}")
    *want, _ = _store_contents(made)
    *got, times = _store_contents(copied)
    assert got == want and want[1][0][1] == "Default" and "/b/mlruns/" in want[1][0][2]
    assert all(created >= before and updated >= before for created, updated in times)
    monkeypatch.undo()
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{copied}")
    assert client.create_experiment("x") and [e.name for e in client.search_experiments()]


def test_a_cache_that_cannot_be_written_makes_each_store_by_migration(tmp_path, monkeypatch, cfg):
    (tmp_path / "cache").write_text("a file where the cache folder would be")
    monkeypatch.setenv("SPARROW_CACHE_DIR", str(tmp_path / "cache" / "sub"))
    tracker = Tracker.start(cfg, "k", tmp_path / "work")
    assert not tracker.resumed and (tmp_path / "work" / "mlflow.db").is_file()
    assert list(tmp_path.glob("cache*")) == [tmp_path / "cache"]
