"""MLflow tracking for a training run: one MLflow run per Sparrow run id, resumed on restart.

    tracker = Tracker.start(cfg, run_id, workdir)      # creates or resumes the MLflow run
    tracker.log_step(3, {"reward/mean": 0.41, "mismatch/p5_bin_0": 0.93, "time/rollout_s": 12.0})
    tracker.log_threshold_event(step=3, bin=2, p5=0.81, target=0.86)
    tracker.log_schedule(schedule, version=2, step=3)
    tracker.log_artifact("report/p5_per_bin.png", subdir="plots")
    tracker.end("finished")

The store is `pipeline.mlflow_uri`, or by default `sqlite:///<workdir>/mlflow.db`; artifacts
go under `<workdir>/mlartifacts` (experiment "sparrow") unless the URI names a tracking
server, which then chooses. Look at it with
`mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow.db`. The MLflow run carries the tag
`sparrow.run_id`, so a flow started again with the same run id logs into the same MLflow run.
The resolved config is logged once, when the MLflow run is made (config.yaml and flattened
params); a resumed flow whose config differs adds it as config-resume-<k>.yaml. MLflow's own
INFO logging (database set-up banners) is turned down to warnings. Only sparrow/runtime/ and the
layers above (sparrow/stages/, sparrow/flows/) import MLflow: the library never does.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import numbers
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sparrow.cache import cache_dir
from sparrow.config import SparrowConfig, to_yaml
from sparrow.errors import SparrowError
from sparrow.sparse.io import schedule_to_dict
from sparrow.sparse.schedule import Schedule
from sparrow.storage.mlflow_store import restamp_default_experiment

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

EXPERIMENT = "sparrow"
RUN_ID_TAG = "sparrow.run_id"
RESUMES_TAG = "sparrow.resumes"
SCHEDULE_TAG = "sparrow.schedule"
SCHEDULE_VERSION_TAG = "sparrow.schedule_version"
CONFIG_ARTIFACT = "config.yaml"
SCHEDULE_DIR = "schedules"
BELOW_TARGET_METRIC = "threshold/below_target"
# MLflow's per-request limits on one log_batch call
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
# the names run statuses go by in storage's runs table and in MLflow
# MLflow's run states; an interrupted run (Ctrl-C) is KILLED there and "interrupted" here
_STATUSES = {
    "finished": "FINISHED",
    "failed": "FAILED",
    "killed": "KILLED",
    "interrupted": "KILLED",
}


class TrackingError(SparrowError):
    """A tracking problem: a bad metric, an unreachable store, a run that cannot be resumed."""


def default_tracking_uri(workdir: str | Path) -> str:
    return f"sqlite:///{Path(workdir).resolve().as_posix()}/mlflow.db"


def artifact_root(workdir: str | Path) -> Path:
    return Path(workdir).resolve() / "mlartifacts"


@contextmanager
def _first_use_lock(uri: str, workdir: str | Path) -> Iterator[None]:
    """Serialize opening a local store: MLflow creates its SQLite tables on first use, and two
    processes doing that at once (two calibrations in one workdir) fail with "table already
    exists". A server store needs no lock."""
    if _is_server(uri):
        yield
        return
    fd = os.open(Path(workdir) / "mlflow.db.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _make_sqlite_whole(uri)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _make_sqlite_whole(uri: str) -> None:
    """Make a new SQLite store under another name and rename it into place once MLflow has
    made all its tables. MLflow's migrations commit one by one, so a process killed among them
    (a run's first seconds) would leave a store on which every later open fails with "table
    ... already exists". Called under the first-use lock, so a scratch store left is stale.
    The migrations take 1-3 s; a new store is a copy of an empty one this MLflow version made
    before (`_store_template`), kept there by the first store made without one."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///") :])
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        stale.unlink()
    if path.exists():
        return
    scratch = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    template = _store_template()
    if template.is_file():
        shutil.copyfile(template, scratch)
        _restamp_default_experiment(scratch)
    else:
        from mlflow.tracking import MlflowClient

        scratch_uri = f"sqlite:///{scratch.as_posix()}"
        MlflowClient(tracking_uri=scratch_uri).search_experiments(max_results=1)
        _close_engine(scratch_uri)
        _keep_template(scratch, template)
    os.replace(scratch, path)


def _store_template() -> Path:
    """Where an empty store of the installed MLflow version is kept, in Sparrow's cache folder
    ($SPARROW_CACHE_DIR, else ~/.cache/sparrow). The version is in the name because each
    version's migrations end at its own schema."""
    from importlib.metadata import version

    return cache_dir() / f"mlflow-{version('mlflow')}-empty.db"


def _keep_template(store: Path, template: Path) -> None:
    """Copy a store MLflow has just made (nothing in it yet) to `template`, whole or not at all
    (a copy under another name renamed into place). A cache that cannot be written is skipped:
    the next store is migrated again."""
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        part = template.with_name(f".{template.name}.tmp-{os.getpid()}")
        shutil.copyfile(store, part)
        os.replace(part, template)
    except OSError:
        pass


def _restamp_default_experiment(store: Path) -> None:
    """Give the copied store's "Default" experiment what MLflow gives it when it makes a store:
    the time now and `./mlruns/0` of this process's directory as its artifact location."""
    restamp_default_experiment(store, str(Path("mlruns").resolve() / "0"), int(time.time() * 1000))


def _close_engine(uri: str) -> None:
    """Close MLflow's pooled connections to `uri` (a scratch store about to be renamed)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
    if engine is not None:
        engine.dispose()


def flatten_config(cfg: SparrowConfig) -> dict[str, str]:
    """Dotted keys to string values ("algo.lr" -> "1e-06"), the form MLflow params take. A
    key whose value is a mapping (data.reward_by_source) is one param: its keys are the
    user's patterns ("chase/*"), which MLflow refuses in a param's name."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if dataclasses.is_dataclass(value):
            for item in dataclasses.fields(value):
                walk(f"{prefix}.{item.name}" if prefix else item.name, getattr(value, item.name))
        else:
            flat[prefix] = str(dict(value) if isinstance(value, Mapping) else value)

    walk("", cfg)
    return flat


class Tracker:
    """Logs one Sparrow run into one MLflow run; `start` makes or resumes it."""

    def __init__(self, client: MlflowClient, mlflow_run_id: str, run_id: str, resumed: bool):
        self.client = client
        self.mlflow_run_id = mlflow_run_id
        self.run_id = run_id
        self.resumed = resumed

    @classmethod
    def start(
        cls, cfg: SparrowConfig, run_id: str, workdir: str | Path, quiet: bool = True
    ) -> Tracker:
        if not run_id or "'" in run_id or "\\" in run_id:
            raise TrackingError(
                f"run id {run_id!r} must be non-empty, without quotes or backslashes"
            )
        if quiet:
            logging.getLogger("mlflow").setLevel(logging.WARNING)
            logging.getLogger("alembic").setLevel(logging.WARNING)
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from sqlalchemy.exc import SQLAlchemyError

        uri = cfg.pipeline.mlflow_uri or default_tracking_uri(workdir)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        try:
            with _first_use_lock(uri, workdir):
                client = MlflowClient(tracking_uri=uri)
                experiment_id = _experiment(
                    client, None if _is_server(uri) else artifact_root(workdir)
                )
            existing = client.search_runs(
                [experiment_id], f"tags.`{RUN_ID_TAG}` = '{run_id}'", max_results=2
            )
        except MlflowException as err:
            raise TrackingError(f"MLflow store {uri} cannot be used: {err.message}") from None
        except SQLAlchemyError as err:  # a store damaged outside MLflow's own checks
            raise TrackingError(
                f"MLflow store {uri} cannot be used ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}); move it aside to start a new one (the run's "
                "files and DuckDB history are kept)"
            ) from None
        if len(existing) > 1:
            raise TrackingError(
                f"MLflow store {uri} holds several runs tagged {RUN_ID_TAG}={run_id}"
            )
        if existing:
            tracker = cls(client, existing[0].info.run_id, run_id, resumed=True)
            tracker._resume(cfg, existing[0])
        else:
            run = client.create_run(experiment_id, tags={RUN_ID_TAG: run_id}, run_name=run_id)
            tracker = cls(client, run.info.run_id, run_id, resumed=False)
            tracker._log_config(cfg)
        return tracker

    def _log_config(self, cfg: SparrowConfig) -> None:
        from mlflow.entities import Param

        self.client.log_text(self.mlflow_run_id, to_yaml(cfg), CONFIG_ARTIFACT)
        params = [Param(k, v) for k, v in flatten_config(cfg).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.mlflow_run_id, params=params[i : i + _PARAMS_PER_BATCH])

    def _resume(self, cfg: SparrowConfig, run) -> None:
        resumes = int(run.data.tags.get(RESUMES_TAG, "0")) + 1
        self.client.set_tag(self.mlflow_run_id, RESUMES_TAG, str(resumes))
        if run.info.status != "RUNNING":
            self.client.update_run(self.mlflow_run_id, status="RUNNING")
        # params are written once; a resumed flow may differ (fail_at removed, more steps)
        if flatten_config(cfg) != dict(run.data.params):
            self.client.log_text(self.mlflow_run_id, to_yaml(cfg), f"config-resume-{resumes}.yaml")

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One step's metrics under the names given; a None value is left out."""
        from mlflow.entities import Metric

        _check_step(step)
        now = int(time.time() * 1000)
        batch = []
        for name, value in metrics.items():
            if value is None:
                continue
            batch.append(Metric(str(name), _number(name, value), now, int(step)))
        for i in range(0, len(batch), _METRICS_PER_BATCH):
            self._call(
                self.client.log_batch, self.mlflow_run_id, metrics=batch[i : i + _METRICS_PER_BATCH]
            )

    def log_threshold_event(self, step: int, bin: int, p5: float, target: float) -> None:
        """A bin whose p5 fell below target: two metrics at `step` and a tag naming step and bin."""
        _check_step(step)
        if not isinstance(bin, numbers.Integral) or bin < 0:
            raise TrackingError(f"threshold event bin must be an integer >= 0, got {bin!r}")
        p5, target = _number("p5", p5), _number("target", target)
        self.log_step(step, {BELOW_TARGET_METRIC: 1.0, f"threshold/p5_bin_{int(bin)}": p5})
        self.client.set_tag(
            self.mlflow_run_id, f"threshold.step{int(step)}.bin{int(bin)}", repr(p5)
        )
        self.client.set_tag(self.mlflow_run_id, "threshold.target", repr(target))

    def log_schedule(self, schedule: Schedule, version: int, step: int) -> str:
        """The schedule as YAML under schedules/; tags name the current one. Returns the artifact path."""
        _check_step(step)
        if not isinstance(version, numbers.Integral) or version < 0:
            raise TrackingError(f"schedule version must be an integer >= 0, got {version!r}")
        artifact = f"{SCHEDULE_DIR}/{schedule.name}-v{int(version)}.yaml"
        text = yaml.safe_dump(
            {**schedule_to_dict(schedule), "version": int(version), "step": int(step)},
            sort_keys=False,
        )
        self.client.log_text(self.mlflow_run_id, text, artifact)
        self.client.set_tag(self.mlflow_run_id, SCHEDULE_TAG, schedule.name)
        self.client.set_tag(self.mlflow_run_id, SCHEDULE_VERSION_TAG, str(int(version)))
        self.log_step(step, {"schedule/version": float(version)})
        return artifact

    def log_artifact(self, path: str | Path, subdir: str | None = None) -> None:
        """A file or a folder (its contents) into the run's artifacts, under `subdir` if given."""
        path = Path(path)
        if not path.exists():
            raise TrackingError(f"artifact {path} does not exist")
        if path.is_dir():
            self.client.log_artifacts(self.mlflow_run_id, str(path), subdir)
        else:
            self.client.log_artifact(self.mlflow_run_id, str(path), subdir)

    def end(self, status: str = "finished") -> None:
        """Close the MLflow run as finished, failed or killed (either case)."""
        mlflow_status = _STATUSES.get(status.lower())
        if mlflow_status is None:
            raise TrackingError(f"run status {status!r} is not one of: {', '.join(_STATUSES)}")
        self.client.set_terminated(self.mlflow_run_id, mlflow_status)

    def _call(self, fn, *args, **kwargs):
        from mlflow.exceptions import MlflowException

        try:
            return fn(*args, **kwargs)
        except MlflowException as err:
            raise TrackingError(
                f"MLflow refused a write to run {self.mlflow_run_id}: {err.message}"
            ) from None


def _experiment(client: MlflowClient, artifacts: Path | None) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    location = artifacts.as_uri() if artifacts is not None else None
    return client.create_experiment(EXPERIMENT, artifact_location=location)


def _is_server(uri: str) -> bool:
    # a tracking server chooses where artifacts go; any local store keeps them in the workdir,
    # not in MLflow's default ./mlruns under whatever folder the flow was started from
    return uri.split(":", 1)[0].lower() in ("http", "https", "databricks")


def _check_step(step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise TrackingError(f"step must be an integer >= 0, got {step!r}")


def _number(name: Any, value: Any) -> float:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TrackingError(f"metric {name!r} must be a number, got {value!r}")
    return float(value)
