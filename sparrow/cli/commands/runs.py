"""`sparrow runs [RUN_ID] [--workdir DIR] [--json]`: training runs and their stage status;
`sparrow runs redo RUN_ID STAGE@STEP`: forget a damaged recorded stage so a resume redoes it.

    sparrow runs                         # every run: status, steps done of steps, last stage
    sparrow runs run-20261121-1952-3f2a  # that run's recorded stages, step by step
    sparrow runs --workdir /data/work --json
    sparrow runs redo run-20261121-1952-3f2a rollout@2   # then: sparrow train pipeline.run_id=...

Status is the `runs` table's (running, finished, failed); a run marked running while no
process holds the workdir's writer lock shows as `interrupted` (it was killed; resume it with
`sparrow train pipeline.run_id=ID`).
A step whose per-token Parquet file is damaged is named in the `damaged` column (and on the
step's aggregate_mismatch row of `sparrow runs ID`); the rest of the workdir reads as usual.
"steps done" counts steps whose sync_weights stage is recorded, out of the run's
pipeline.steps. Reads the DuckDB file read-only, so it works while a run is writing.
`redo` forgets STAGE at STEP and the stages recorded after it in that step, removes their
folders and marks the run interrupted (sparrow/runtime/ledger/redo.py); it takes the writer
lock, so it is refused while a run writes the workdir.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from sparrow.cli.output import print_json, print_table
from sparrow.config.schema import PipelineConfig
from sparrow.errors import SparrowError
from sparrow.storage.layout import process_alive


class UnknownRunError(SparrowError):
    """A run id that the workdir does not hold."""


class _RunsWords(argparse.Action):
    """RUN_ID, or redo ...: a second word after a run id is a usage error at parse time."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) > 1 and values[0] != "redo":  # redo's own words: checked by run()
            parser.error(f"expected RUN_ID or redo RUN_ID STAGE@STEP, got: {' '.join(values)}")
        setattr(namespace, self.dest, values)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="training runs of a workdir and their stages")
    parser.add_argument(
        "words",
        nargs="*",
        action=_RunsWords,
        metavar="RUN_ID | redo RUN_ID STAGE@STEP",
        help="show this run's recorded stages; or forget STAGE at STEP (and the stages after "
        "it in that step) so the next `sparrow train pipeline.run_id=RUN_ID` runs them again",
    )
    parser.add_argument(
        "--workdir", default=PipelineConfig.workdir, help="the runs' pipeline.workdir"
    )
    parser.add_argument("--json", action="store_true", help="print a list of row objects")
    parser.set_defaults(func=run)


def writer_alive(workdir: str | Path) -> bool:
    """True while a process holds the workdir's writer lock (sparrow.storage.Store.open_writer).

    Read from /proc/locks where there is one, so this never takes the lock itself (a probe
    could make a starting writer fail); elsewhere, whether the pid in the lock file lives.
    """
    from sparrow.storage.store import LOCK_FILENAME

    lock = Path(workdir) / LOCK_FILENAME
    try:
        stat = lock.stat()
        held = Path("/proc/locks").read_text()
    except FileNotFoundError:
        return _pid_alive(lock) if lock.exists() else False
    key = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    return any(
        fields[1:2] == ["FLOCK"] and key in fields
        for fields in (line.split() for line in held.splitlines())
    )


def _pid_alive(lock: Path) -> bool:
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    return pid > 0 and process_alive(pid)


def run_rows(workdir: str) -> list[dict]:
    from sparrow.storage.run_rows import runs_listing

    alive = writer_alive(workdir)
    result = runs_listing(workdir)
    rows = []
    for row in result.as_dicts():
        config = yaml.safe_load(row.pop("config_yaml") or "") or {}
        status = row["status"]
        if status == "running" and not alive:
            status = "interrupted"
        rows.append(
            {
                "run_id": row["run_id"],
                "status": status,
                "steps_done": int(row["steps_done"]),
                "steps": config.get("pipeline", {}).get("steps"),
                "stages": int(row["stages"]),
                "last_stage": row["last_stage"],
                "created_at": str(row["created_at"]),
                "model_path": row["model_path"],
                "mlflow_run_id": row["mlflow_run_id"],
                "damaged": _damaged_steps(result, row["run_id"]) or None,
            }
        )
    return rows


def _damaged_steps(result, run_id: str) -> str:
    """'step-2 step-5': the steps of this run whose tokens.parquet could not be read."""
    return " ".join(f"step-{d.step}" for d in result.damaged if d.run_id == run_id)


def stage_rows(workdir: str, run_id: str) -> list[dict]:
    from sparrow.storage.run_rows import recorded_run_ids, stages_listing

    runs = recorded_run_ids(workdir)
    if run_id not in runs:
        raise UnknownRunError(
            f"workdir {workdir} has no run {run_id!r}; runs: {', '.join(runs) or '(none)'}"
        )
    result = stages_listing(workdir, run_id)
    damaged = {d.step: d for d in result.damaged if d.run_id == run_id}
    rows = result.as_dicts()
    for row in rows:
        row["started_at"], row["finished_at"] = str(row["started_at"]), str(row["finished_at"])
        bad = damaged.get(row["step"]) if row["stage"] == "aggregate_mismatch" else None
        row["damaged"] = f"tokens.parquet: {bad.reason}" if bad else None
    return rows


def redo(workdir: str, run_id: str, spec: str, as_json: bool) -> int:
    from sparrow.runtime.ledger.redo import parse_stage_at, redo_stage
    from sparrow.storage.run_rows import recorded_run_ids

    stage, step = parse_stage_at(spec)
    if run_id not in recorded_run_ids(workdir):
        raise UnknownRunError(f"workdir {workdir} has no run {run_id!r}")
    forgotten = redo_stage(workdir, run_id, stage, step)
    if as_json:
        print_json({"run_id": run_id, "step": step, "forgotten": forgotten})
        return 0
    print(f"run {run_id}: forgot {', '.join(forgotten)} at step {step}; resume with")
    print(f"  sparrow train pipeline.workdir={workdir} pipeline.run_id={run_id}")
    return 0


def run(args: argparse.Namespace) -> int:
    words = args.words
    if words[:1] == ["redo"] and len(words) > 1:
        if len(words) != 3:
            raise SparrowError("usage: sparrow runs redo RUN_ID STAGE@STEP [--workdir DIR]")
        return redo(args.workdir, words[1], words[2], args.json)
    if len(words) > 1:
        raise SparrowError(f"expected at most one RUN_ID, got {' '.join(words)}")
    run_id = words[0] if words else None
    rows = stage_rows(args.workdir, run_id) if run_id else run_rows(args.workdir)
    if args.json:
        print_json(rows)
    else:
        title = f"run {run_id}: recorded stages" if run_id else f"runs in {args.workdir}"
        print_table(rows, title=title)
    return 0
