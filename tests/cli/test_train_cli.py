"""`sparrow train`: bad config and missing model are one line before Prefect starts; a real
run on a fresh Prefect home (its ephemeral API, no server) prints the table and where to look,
and no Prefect, Ray or MLflow log noise.

Run: `python -m pytest tests/cli/test_train_cli.py -q` (the real run is marked slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks.chaos_soak import alive, descendants
from sparrow.cli.main import main


@pytest.fixture
def no_flow(monkeypatch):
    """A stand-in sparrow.flows.train whose flow must not be reached."""
    stub = types.ModuleType("sparrow.flows.train")

    def train_flow(*args, **kwargs):
        raise AssertionError("the flow started although the input was bad")

    stub.train_flow = train_flow
    monkeypatch.setitem(sys.modules, "sparrow.flows.train", stub)


def test_unknown_key_is_one_line_and_starts_nothing(capsys, tmp_path, no_flow):
    assert main(["train", "pipeline.stepz=2", f"pipeline.workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown config key 'pipeline.stepz'" in err[0]
    assert not (tmp_path / "w").exists()


def test_missing_model_directory_is_one_line(capsys, tmp_path, no_flow):
    missing = tmp_path / "nope"
    assert main(["train", f"model.path={missing}", f"pipeline.workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: model directory {missing} does not exist"]


@pytest.mark.slow
def test_real_run_prints_the_table_and_where_to_look(base_run):
    """The session's base run (tests/conftest.py): `sparrow train` on a fresh Prefect home."""
    done, workdir, env = base_run.done, base_run.workdir, base_run.env
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "reward"])
    assert [line.split()[0] for line in lines[header + 1 : header + 3]] == ["1", "2"]
    assert f"mlflow ui --backend-store-uri sqlite:///{workdir.resolve()}/mlflow.db" in done.stdout
    assert f"sparrow query --workdir {workdir}" in done.stdout
    noise = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if " | INFO" in line
        or "INFO mlflow" in line
        or "temporary server" in line
        or "Ray instance" in line
    ]
    assert noise == []
    listed = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", "runs", "--workdir", str(workdir), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    [run] = json.loads(listed.stdout)
    assert (run["run_id"], run["status"], run["steps_done"], run["steps"]) == (
        base_run.run_id,
        "finished",
        2,
        2,
    )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, inside MLflow
def test_real_run_writes_its_report_into_the_run_folder_and_mlflow(base_run):
    """pipeline.report (on by default): the plots and summary of `sparrow report`, written at
    the end of the run into runs/<run_id>/report and the MLflow run's plots/."""
    from mlflow.tracking import MlflowClient

    assert base_run.done.returncode == 0, base_run.done.stderr[-3000:]
    folder = base_run.workdir / "runs" / base_run.run_id / "report"
    pngs = ["acceptance_step2.png", "p5_per_bin.png", "reward_length.png", "summary.png"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*pngs, "summary.md"])
    assert all((folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)
    assert f"`{base_run.run_id}`" in (folder / "summary.md").read_text()
    client = MlflowClient(tracking_uri=f"sqlite:///{base_run.workdir.resolve()}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("sparrow").experiment_id])
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert logged == {f"plots/{name}" for name in [*pngs, "summary.md"]}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard uses /proc and prctl")
@pytest.mark.parametrize("killed", ["command", "prefect-server"])
def test_kill_9_leaves_no_process_behind(tmp_path, killed):
    """kill -9 of `sparrow train` once its actor decodes: Prefect's server, Ray's GCS, raylet,
    dashboard and runtime-env agents and the actor are all gone soon after (the guard's grace
    and the exits of processes mapping Ray's object store: within 30 s on two loaded cores;
    without the guard Ray's agents wait about two minutes).
    kill -9 of its Prefect server instead: the command ends at once with one line saying so
    and how to resume (not minutes of client retries), and leaves nothing behind either."""
    import signal
    import time

    from sparrow.flows.server_guard import GRACE_S, SERVER_MARK

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparrow.cli.main",
            "train",
            f"pipeline.workdir={workdir}",
            "pipeline.run_id=k",
            "pipeline.steps=50",
            "data.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=16",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("wb"),  # a file: a full pipe would stall the run
    )
    deadline = time.time() + 300
    while (
        time.time() < deadline
        and proc.poll() is None
        and not list((workdir / "runs" / "k").glob("step-1/*rollout*"))
    ):
        time.sleep(0.2)
    time.sleep(2.0)  # the guard notes the processes once a second
    started = descendants(proc.pid)
    marks = b" ".join(started.values())
    assert SERVER_MARK.encode() in marks and b"raylet" in marks, marks[:2000]
    assert b"DashboardAgent" in marks or b"dashboard_agent" in marks or b"agent" in marks
    if killed == "command":
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    else:
        (server,) = [pid for pid, cmd in started.items() if SERVER_MARK.encode() in cmd]
        os.kill(server, signal.SIGKILL)
        proc.wait(timeout=30)
        err = (tmp_path / "stderr").read_bytes()
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 1, err[-2000:]
        assert "Prefect's API server" in lines[-1] and "resume" in lines[-1], err[-2000:]
    deadline = time.time() + GRACE_S + 27
    left = dict(started)
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = {pid: started[pid] for pid in alive(started)}
    assert left == {}, {pid: _described(pid, cmd) for pid, cmd in left.items()}


def _described(pid: int, cmdline: bytes) -> str:
    """A process's command line (its NUL padding dropped) and its state and parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        stat = ["gone", "?"]
    args = b" ".join(part for part in cmdline.split(b"\0") if part).decode(errors="replace")
    return f"{args[:300]} (state {stat[0]}, parent {stat[1]})"


@pytest.mark.slow
def test_real_ctrl_c_is_one_line_and_the_run_resumes(tmp_path):
    """SIGINT to the process group of a real `sparrow train` in its first step, as Ctrl-C in a
    terminal sends it (Prefect's server and Ray sit in groups of their own, so only the flow
    sees it): one line on stderr, exit status 130 within a minute, the run marked interrupted;
    the same command then finishes it."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    workdir = tmp_path / "w"
    command = [
        sys.executable,
        "-m",
        "sparrow.cli.main",
        "train",
        f"pipeline.workdir={workdir}",
        "pipeline.run_id=c",
        "pipeline.steps=2",
        "data.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=16",
        "pipeline.report=false",
    ]
    # its own process group, as a shell starts a foreground job: Ctrl-C signals the group
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    # the rollout stage's scratch folder appears once the flow is running its first stage
    while (
        time.time() < deadline
        and proc.poll() is None
        and not list((workdir / "runs" / "c").glob("step-1/*rollout*"))
    ):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends: the whole group
    sent = time.time()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert time.time() - sent < 60, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted"), err[-2000:]
    listed = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", "runs", "--workdir", str(workdir), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert json.loads(listed.stdout)[0]["status"] == "interrupted"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", "runs", "--workdir", str(workdir), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    [run] = json.loads(listed.stdout)
    assert (run["status"], run["steps_done"]) == ("finished", 2)


def test_zero_steps_is_refused_before_anything_starts(capsys, tmp_path, no_flow):
    assert main(["train", "pipeline.steps=0", f"pipeline.workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: pipeline.steps=0: a run needs at least 1")
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_prefect_server_that_does_not_start_is_one_line_and_left_stopped(tmp_path):
    """Prefect's temporary API server not answering in time (here a 0 s start-up timeout):
    exit 2 with one line naming PREFECT_HOME, not Prefect's traceback, and the server stopped."""
    from sparrow.flows.server_guard import SERVER_MARK

    home = tmp_path / "home" / "prefect"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")
    done = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.main", "train", f"pipeline.workdir={tmp_path / 'w'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Prefect's temporary API server did not start"), last
    assert f"PREFECT_HOME={home}" in last and "Traceback" not in done.stderr
    servers = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if SERVER_MARK.encode() in (proc / "cmdline").read_bytes():
                if f"PREFECT_HOME={home}".encode() in (proc / "environ").read_bytes():
                    servers.append(proc.name)
        except OSError:
            continue
    assert servers == []
