"""Synchronous against one-step-off training through the real train flow: steps per hour, the
share of the time engines and trainer are busy, and the staleness of what was trained on,
each for dense and sparse rollout.

    python benchmarks/async_pipeline.py --gpus 4 --new-tokens 32768 --out results/async_4gpu.json
    python benchmarks/async_pipeline.py --gpus 2 --new-tokens 8192 --eos      # lengths spread
    python benchmarks/async_pipeline.py --gpus 1 --layers 8 --new-tokens 4096  # one GPU, quick
    python benchmarks/async_pipeline.py --merge a.json b.json --out both.json  # calls apart
    python benchmarks/async_pipeline.py --smoke       # CPU, tiny model, in-process trainer

The JSON is written after each mode; the same command again (same --workdir) reads the arms
already finished back and runs the rest, so a case longer than one call spans several. On one
H200 each run of the quick case takes about 3.5 minutes (services, compile, 5 steps).

Modes (docs/async.md):
- `sync`: pipeline.max_staleness=0; on G GPUs a trainer group of G ranks with one engine on
  each rank's GPU (rollout.placement=colocated, the ranks offloaded during the rollout); on one
  GPU the trainer in the flow's process beside the engine.
- `async`: pipeline.max_staleness=1, the rollout of step n+1 generated while step n scores and
  updates; on G GPUs (G even) G/2 trainer ranks and G/2 engines on GPUs of their own
  (rollout.placement=separate); on one GPU the engine and the trainer share it, and since the
  engine keeps its KV cache through the update, both modes give it 45% of the GPU's memory.
Each (mode, arm) is rl_step.py's arm: one `train_flow` process, the 1.7B shape's random
weights (--layers deep) with the real vocabulary, --prompts x --samples sequences, eos off
(every sample to --new-tokens) unless --eos (random weights then stop at a random eos draw,
so lengths spread). Steps are timed from step 3 (step 1 starts the services and compiles;
step 2 is the first whose rollout was generated in flight): a step's wall time is the gap
between the ends of consecutive steps in `stage_runs`, which counts the overlap, unlike the
sum of the stages. Per (mode, arm): seconds per step and steps per hour, the trainer's busy
share (dense_score and policy_update over the wall time; sync_weights is apart, since
one-step-off it first waits for the rollout in flight), the engines' busy share (the
generation's own seconds, `time/rollout_generate_s`), staleness (updates between the weights
that generated a step's samples and the ones it trains: step - 1 - rollout/policy_version),
rollout tokens/s. Per arm: `speedup`, async steps per hour over sync's.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rl_step  # noqa: E402 - the arm runner this benchmark reuses

MODES = ("sync", "async")
TRAINER_STAGES = ("dense_score", "policy_update")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, 3 short steps")
    parser.add_argument("--gpus", type=int, default=4, help="1, or an even count for async")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the 1.7B shape")
    parser.add_argument("--new-tokens", type=int, default=8192)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="per run; timed from step 3")
    parser.add_argument("--arms", default="dense,sparse")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--eos", action="store_true", help="stop at eos (lengths spread)")
    parser.add_argument("--schedule", default="qwen3-1.7b-0.86")
    parser.add_argument("--workdir", default="/tmp/sparrow-async-pipeline")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep-runs", action="store_true", help="keep each run's folders")
    parser.add_argument("--out", default=None)
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.new_tokens, args.prompts, args.samples = 1, 16, 2, 2
        args.steps, args.arms = 3, "sparse"
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    if args.gpus < 1 or ("async" in modes and args.gpus > 1 and args.gpus % 2):
        parser.error(f"--gpus {args.gpus}: async needs 1 GPU or an even count (half are engines)")
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: at least 3 (steps are timed from step 3)")
    return args


def mode_overrides(mode: str, gpus: int) -> list[str]:
    """The flow's settings of a mode on `gpus` GPUs (module doc)."""
    pipelined = mode == "async"
    # one-step-off, a resumed rollout starts from the policy two updates back
    sets = [f"pipeline.max_staleness={int(pipelined)}"]
    sets += ["pipeline.keep_checkpoints=2"] if pipelined else []
    if gpus == 1:  # engine and trainer share the GPU; one-step-off the KV cache stays put
        return sets + [
            "trainer.num_workers=0",
            "rollout.num_actors=1",
            "rollout.gpu_memory_utilization=0.45",  # both modes, so the same KV budget
        ]
    ranks = gpus // 2 if pipelined else gpus
    return sets + [
        f"trainer.num_workers={ranks}",
        f"rollout.num_actors={ranks}",
        f"rollout.placement={'separate' if pipelined else 'colocated'}",
        f"trainer.offload_during_rollout={str(not pipelined).lower()}",
        "trainer.gradient_checkpointing=true",
    ]


def mode_args(args, mode: str) -> argparse.Namespace:
    """rl_step's arguments for one mode: its own workdir, the mode's settings, then --set."""
    eos = ["rollout.ignore_eos=false"] if args.eos else []
    return argparse.Namespace(
        smoke=args.smoke,
        prompts=args.prompts,
        samples=args.samples,
        steps=args.steps,
        arms=args.arms,
        schedule=args.schedule,
        layers=args.layers,
        workdir=str(Path(args.workdir) / f"{mode}-{args.gpus}gpu"),
        set=mode_overrides(mode, args.gpus) + eos + list(args.set),
        keep_runs=args.keep_runs,
    )


def _time(value) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def pipeline_figures(stages: list[dict], metrics: list[dict], first_timed: int = 3) -> dict:
    """The module doc's per-run figures from `stage_runs` rows (step, stage, started_at,
    finished_at, duration_s) and `step_metrics` rows (step, name, value)."""
    ends: dict[int, float] = {}
    for row in stages:
        ends[row["step"]] = max(ends.get(row["step"], 0.0), _time(row["finished_at"]))
    timed = [s for s in sorted(ends) if s >= first_timed and s - 1 in ends]
    if not timed:
        raise ValueError(f"no step from {first_timed} on with the step before it recorded")
    wall = sum(ends[s] - ends[s - 1] for s in timed)

    def total(name: str) -> float:
        return sum(
            r["value"] for r in metrics if r["name"] == name and r["step"] in timed and r["value"]
        )

    trainer = sum(
        r["duration_s"] for r in stages if r["stage"] in TRAINER_STAGES and r["step"] in timed
    )
    sync = sum(
        r["duration_s"] for r in stages if r["stage"] == "sync_weights" and r["step"] in timed
    )
    versions = {r["step"]: r["value"] for r in metrics if r["name"] == "rollout/policy_version"}
    staleness = [s - 1 - versions[s] for s in timed if versions.get(s) is not None]
    tokens, generate = total("rollout/tokens"), total("time/rollout_generate_s")
    step_s = wall / len(timed)
    return {
        "timed_steps": timed,
        "step_s": step_s,
        "steps_per_hour": 3600.0 / step_s,
        "trainer_busy": trainer / wall,
        "engine_busy": generate / wall,
        "sync_s": sync / len(timed),
        "staleness": sum(staleness) / len(staleness) if staleness else None,
        "rollout_tokens_per_s": tokens / generate if generate else None,
        "tokens_per_step": tokens / len(timed),
    }


def run_figures(workdir: str, run_id: str) -> dict:
    from sparrow.storage.report_rows import step_metric_rows
    from sparrow.storage.run_rows import stages_listing

    return pipeline_figures(
        stages_listing(workdir, run_id).as_dicts(), step_metric_rows(workdir, run_id)
    )


def mode_row(args, mode: str, path: str) -> dict[str, Any]:
    """Every arm of one mode, each one rl_step arm (read back when already done)."""
    sized = mode_args(args, mode)
    arms = {}
    for arm in args.arms.split(","):
        stats = rl_step.run_arm(sized, arm, args.new_tokens, path)
        done = Path(sized.workdir) / f"{arm}-{args.new_tokens}" / "done.json"
        summary = json.loads(done.read_text())
        arms[arm] = {**run_figures(summary["workdir"], summary["run_id"]), "stages": stats}
    return {"mode": mode, "overrides": sized.set, "arms": arms}


def speedups(modes: dict[str, dict]) -> dict[str, float]:
    """Per arm: async steps per hour over sync's (both modes measured)."""
    if not {"sync", "async"} <= set(modes):
        return {}
    sync, pipelined = modes["sync"]["arms"], modes["async"]["arms"]
    return {
        arm: pipelined[arm]["steps_per_hour"] / sync[arm]["steps_per_hour"]
        for arm in sync
        if arm in pipelined
    }


def merge(paths: list[str]) -> dict[str, Any]:
    """Modes measured in separate calls (one mode each, the 10-minute calls) as one report."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    modes: dict[str, dict] = {}
    for run in runs:
        modes.update(run["modes"])
    keep = {k: runs[0][k] for k in ("gpus", "new_tokens", "batch", "eos", "layers")}
    return {
        "benchmark": "async_pipeline",
        **keep,
        "facts": [run.get("facts") for run in runs],
        "modes": modes,
        "speedup": speedups(modes),
        "merged_from": list(paths),
    }


def main(argv=None) -> int:
    from benchmarks.common import device_facts, write_json

    args = parse_args(argv)
    if args.merge:
        write_json(args.out, merge(args.merge))
        return 0
    path = rl_step.model_path(args)
    report: dict[str, Any] = {
        "benchmark": "async_pipeline",
        "gpus": args.gpus,
        "new_tokens": args.new_tokens,
        "batch": args.prompts * args.samples,
        "eos": args.eos,
        "layers": args.layers,
        "facts": device_facts(),
        "modes": {},
        "speedup": {},
    }
    # written after each mode, so a call cut by its time limit keeps the modes done; the same
    # command again (same --workdir) reads the finished arms back and runs the rest
    for mode in args.modes.split(","):
        report["modes"][mode] = mode_row(args, mode, path)
        report["speedup"] = speedups(report["modes"])
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
