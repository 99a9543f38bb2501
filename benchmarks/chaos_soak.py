"""Chaos soak: `sparrow train` killed at random moments, resumed each time, ends equal to an
uninterrupted run, with no process or scratch folder left. CPU; prints JSON.

    python benchmarks/chaos_soak.py --steps 6 --kills 6 --seed 0 --out /tmp/soak.json
    python benchmarks/chaos_soak.py --steps 2 --kills 3 --targets flow,actor,prefect   # brief

First the reference: the run uninterrupted, timed. Then the same run id in another workdir,
as a chain of processes: each is the same `sparrow train` command (its own Prefect temporary
server and local Ray, as a user runs it). Once a process's rollout actor runs (its services
are up), a killer picks a seeded random moment within the next step's work (the reference's
seconds per step) and sends SIGKILL to one target, in turn from --targets:
- flow: the `sparrow train` process itself; the next process resumes the run;
- actor: a Ray rollout actor (`ray::RolloutWorker`); the flow replaces it and goes on;
- prefect: Prefect's temporary API server; the command ends with one line and exit 1
  (should it hang instead, it is killed after --hang-s and the outcome says so), and the
  next process resumes.
A kill that comes after the process finished, or finds no process of its target (a server
already stopped at the end of a run), is not counted: the same target is tried again.
When --kills are spent, the last process runs to the end. Then: every table of the two workdirs compared row by row
(stage_runs once each; step_metrics but wall-clock ones; bin_stats; threshold_events;
schedules; the per-token rows of every step), the final policy weights compared bit for bit,
no scratch folder under runs/, no process that ended in error without being killed (an
actor's death must not fail the flow), and no process that any of the chain's commands started
still alive (a killed command's are taken down by sparrow/flows/server_guard.py's watchdog
within its grace). Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

SMALL = (
    "data.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "rollout.max_new_tokens=16",
    "rollout.temperature=2.0",
    # bins of 4 samples x 16 tokens count from 8 tokens of 2 trajectories (the default floor is
    # for real batches), so bin_stats and threshold_events have rows to compare
    "calibrate.min_bin_tokens=8",
    "calibrate.min_bin_samples=2",
    "pipeline.keep_checkpoints=0",
    "pipeline.report=false",
)
# metrics that measure wall-clock time, and so differ between two runs of one input
VARYING = ("time/", "rollout/tokens_per_s", "memory/")
TABLES = {
    "stage_runs": "SELECT step, stage, count(*) FROM stage_runs GROUP BY ALL ORDER BY ALL",
    "step_metrics": "SELECT step, name, value FROM step_metrics ORDER BY ALL",
    "bin_stats": "SELECT * FROM bin_stats ORDER BY ALL",
    "threshold_events": "SELECT * EXCLUDE (created_at) FROM threshold_events ORDER BY ALL",
    "schedules": "SELECT * EXCLUDE (created_at, yaml_path) FROM schedules ORDER BY ALL",
    "token_mismatch": "SELECT * EXCLUDE (run_id) FROM token_mismatch ORDER BY ALL",
    "runs": "SELECT run_id, status FROM runs ORDER BY ALL",
}
ACTOR_MARK, SERVER_MARK = b"ray::RolloutWorker", b"prefect.server.api.server:create_app"


def descendants(pid: int) -> dict[int, bytes]:
    """Every process under `pid`, with its command line."""
    found, todo = {}, [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                try:
                    found[kid] = Path(f"/proc/{kid}/cmdline").read_bytes()
                except OSError:
                    continue
                todo.append(kid)
    return found


def alive(seen: dict[int, bytes]) -> dict[int, str]:
    """The processes of `seen` still running (same pid, same command line)."""
    left = {}
    for pid, cmdline in seen.items():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                left[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            pass
    return left


def command(workdir: Path, run_id: str, steps: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sparrow.cli.main",
        "train",
        f"pipeline.workdir={workdir}",
        f"pipeline.run_id={run_id}",
        f"pipeline.steps={steps}",
        *extra,
    ]


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
        )


def watch(proc: subprocess.Popen, seen: dict, until: float, ready: bool = False) -> bool:
    """Note the process's descendants until `until` (monotonic), or with `ready` until its
    rollout actor runs (the services are up); True if the process ended first."""
    while time.monotonic() < until:
        if proc.poll() is not None:
            return True
        found = descendants(proc.pid)
        seen.update(found)
        if ready and any(ACTOR_MARK in cmd for cmd in found.values()):
            return False
        time.sleep(0.25)
    return proc.poll() is not None


def kill(proc: subprocess.Popen, target: str, seen: dict, hang_s: float) -> str:
    """SIGKILL the target now; what became of the flow process."""
    if target == "flow":
        proc.kill()
        proc.wait()
        return "killed"
    mark = ACTOR_MARK if target == "actor" else SERVER_MARK
    victims = [pid for pid, cmd in descendants(proc.pid).items() if mark in cmd]
    if not victims:
        return "no target"
    os.kill(victims[0], signal.SIGKILL)
    if target == "actor":
        return "actor killed, flow went on"
    if watch(proc, seen, time.monotonic() + hang_s):
        return f"flow exited {proc.returncode}"
    proc.kill()
    proc.wait()
    return f"flow hung {hang_s:.0f} s, killed"


def failure(proc: subprocess.Popen, log: Path, offset: int) -> dict:
    """A process that failed on its own: its exit code and the last lines it wrote."""
    with open(log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").strip().splitlines()
    return {"exit": proc.returncode, "last_lines": lines[-8:]}


def chain(args, env: dict, extra: list[str], step_s: float, root: Path) -> dict:
    """The interrupted chain (module doc); its kills, processes and what it left running.
    A kill lands at a seeded random moment of the step under way once the services are up
    (step_s: the reference's seconds per step)."""
    rng = random.Random(args.seed)
    targets = args.targets.split(",")
    cmd = command(root / "chaos", "soak", args.steps, extra)
    log = root / "chaos.log"
    kills, seen, processes, proc, failed, offset = [], {}, 0, None, [], 0
    while processes <= args.kills + 5:  # a process that keeps failing on its own stops it
        if proc is None or proc.poll() is not None:
            processes += 1
            offset = log.stat().st_size if log.exists() else 0
            proc = start(cmd, env, log)
        if len(kills) >= args.kills:
            if not watch(proc, seen, time.monotonic() + args.timeout_s) or proc.returncode == 0:
                break
            failed.append(failure(proc, log, offset))
            continue
        target = targets[len(kills) % len(targets)]
        if watch(proc, seen, time.monotonic() + args.timeout_s, ready=True):
            if proc.returncode == 0:
                break
            failed.append(failure(proc, log, offset))
            continue
        delay = rng.uniform(0.05, 1.0) * step_s  # within the step under way
        if watch(proc, seen, time.monotonic() + delay):
            if proc.returncode == 0:
                break  # the run finished before this kill: nothing left to interrupt
            failed.append(failure(proc, log, offset))
            continue
        outcome = kill(proc, target, seen, args.hang_s)
        if outcome == "no target":  # not up yet, or already stopped: the same target again
            continue
        kills.append({"target": target, "after_s": round(delay, 1), "outcome": outcome})
    time.sleep(args.grace_s)  # the watchdog of a killed command sends SIGKILL after its grace
    return {
        "kills": kills,
        "processes": processes,
        "failed_unkilled": len(failed),  # processes that ended nonzero with no kill of theirs
        "failures": failed[:3],  # the first ones' exit codes and last lines, to say why
        "exit": proc.returncode,
        "left": alive(seen),
    }


def rows(workdir: Path, sql: str) -> list[tuple]:
    """The rows, NaN as a string (NaN != NaN would make equal tables differ)."""
    from sparrow.storage.query import query

    return [
        tuple("nan" if isinstance(v, float) and v != v else v for v in row)
        for row in query(workdir, sql).rows
    ]


def compare(reference: Path, chaos: Path, run_id: str, steps: int) -> dict:
    """Row-by-row equality of every table, the final weights, scratch folders left."""
    from safetensors.torch import load_file

    tables = {}
    for name, sql in TABLES.items():
        want, got = rows(reference, sql), rows(chaos, sql)
        if name == "step_metrics":
            want = [r for r in want if not r[1].startswith(VARYING)]
            got = [r for r in got if not r[1].startswith(VARYING)]
        tables[name] = {"rows": len(want), "equal": want == got}
    once = all(row[2] == 1 for row in rows(chaos, TABLES["stage_runs"]))
    final = f"runs/{run_id}/step-{steps}/policy_update/model.safetensors"
    weights = (chaos / final).is_file()  # a chain that never finished has no final weights
    if weights:
        want_w, got_w = load_file(str(reference / final)), load_file(str(chaos / final))
        weights = want_w.keys() == got_w.keys() and all(
            bool((want_w[k] == got_w[k]).all()) for k in want_w
        )
    scratch = [str(p) for p in (chaos / "runs").rglob(".*.tmp-*")]
    return {"tables": tables, "stages_once": once, "weights_equal": weights, "scratch": scratch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--targets", default="flow,actor,flow,prefect")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="", help="folder for both workdirs (a temp one)")
    parser.add_argument("--hang-s", type=float, default=240.0)
    parser.add_argument("--grace-s", type=float, default=6.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--full", action="store_true", help="the embedded default's own sizes")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args(argv)
    import tempfile

    root = Path(args.root or tempfile.mkdtemp(prefix="chaos-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    extra = ["pipeline.report=false"] if args.full else list(SMALL)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env.update(PREFECT_HOME=str(root / "prefect-home"), PYTHONUNBUFFERED="1")
    clock = time.monotonic()
    ref = start(command(root / "reference", "soak", args.steps, extra), env, root / "ref.log")
    ref_seen: dict = {}
    watch(ref, ref_seen, time.monotonic() + args.timeout_s, ready=True)
    startup = time.monotonic() - clock
    watch(ref, ref_seen, time.monotonic() + args.timeout_s)
    duration = time.monotonic() - clock
    if ref.returncode != 0:
        raise SystemExit(f"the reference run failed ({ref.returncode}); see {root / 'ref.log'}")
    clock = time.monotonic()
    result = chain(args, env, extra, (duration - startup) / args.steps, root)
    result.update(
        steps=args.steps,
        seed=args.seed,
        sizes="embedded default" if args.full else " ".join(SMALL),
        reference_s=round(duration, 1),
        reference_startup_s=round(startup, 1),
        chain_s=round(time.monotonic() - clock, 1),
        root=str(root),
        **compare(root / "reference", root / "chaos", "soak", args.steps),
    )
    ok = (
        result["exit"] == 0
        and result["failed_unkilled"] == 0
        and result["stages_once"]
        and result["weights_equal"]
        and all(t["equal"] for t in result["tables"].values())
        and not result["scratch"]
        and not result["left"]
    )
    result["ok"] = ok
    text = json.dumps(result, indent=2)
    print(text)
    for out in filter(None, (args.out, root / "result.json")):
        Path(out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
