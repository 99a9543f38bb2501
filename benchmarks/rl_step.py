"""The whole RL step through the real train flow (Ray, Prefect, DuckDB, MLflow), dense against
sparse rollout: per-stage seconds from step 2 on, rollout and step speedups, MFU of the two
trainer stages, peak memory.

    python benchmarks/rl_step.py --new-tokens 8192 --out results/rl_step.json     # GPU, 1.7B
    python benchmarks/rl_step.py --new-tokens 32768 --set trainer.gradient_checkpointing=true \
        --set trainer.offload_during_rollout=true
    python benchmarks/rl_step.py --smoke        # the same code on CPU, tiny model, ~1 minute

Target case: a random-weight model of Qwen3-1.7B's shapes (28 layers, hidden 2048, 16 q / 8 kv
heads, head dim 128, MLP 6144, tied embeddings) with the real vocabulary (151,936), written
once as safetensors under --workdir; 2 prompts x 8 samples (batch 16) of the synthetic task;
eos off (rollout.ignore_eos) so every sample runs to --new-tokens; dense rollout against the
--schedule preset. Each arm is one `train_flow` run in its own process (a fresh GPU), its
metrics read back from the run's DuckDB file (no end-of-run report: pipeline.report=false).
The controller is held (control.patience above the step count) so both arms decode under
fixed settings; the stability runs use the default controller. MFU: model FLOPs (2 x matmul parameters x tokens, plus causal attention
4 x layers x q heads x head dim x T^2 / 2 per sequence; the update counts 3 forwards, not
the recomputation of checkpointing) over seconds x the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = (
    "rollout",
    "reward",
    "dense_score",
    "aggregate_mismatch",
    "reoptimize_schedule",
    "policy_update",
    "sync_weights",
)
# dense bf16 tensor-core peak (FLOP/s) of the GPUs the project measures on (SXM parts)
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12}
SHAPE_17B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    num_layers=28,
    num_q_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=6144,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    max_position_embeddings=40_960,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, short run")
    parser.add_argument("--new-tokens", default="8192", help="comma-separated lengths")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per arm (timed from 2 on)")
    parser.add_argument("--arms", default="dense,sparse")
    parser.add_argument("--schedule", default="qwen3-1.7b-0.86")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the model")
    parser.add_argument("--workdir", default="/tmp/sparrow-rl-step")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for both arms",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep-runs", action="store_true", help="keep each arm's run folders")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def model_path(args: argparse.Namespace) -> str:
    if args.smoke:
        return "builtin:tiny"
    from sparrow.model.random_checkpoint import make_random_checkpoint

    folder = Path(args.workdir) / f"qwen3-1.7b-shape-{args.layers}l"
    if not (folder / "model.safetensors").exists() and not list(folder.glob("*.safetensors")):
        shape = dict(SHAPE_17B, num_layers=args.layers)
        make_random_checkpoint(folder, "qwen3", seed=0, **shape)
    return str(folder)


def arm_overrides(args, arm: str, new_tokens: int, path: str) -> list[str]:
    work = Path(args.workdir) / f"{arm}-{new_tokens}"
    sets = [
        f"model.path={path}",
        f"pipeline.workdir={work}",
        f"pipeline.steps={args.steps}",
        f"data.prompts_per_step={args.prompts}",
        f"rollout.samples_per_prompt={args.samples}",
        f"rollout.max_new_tokens={new_tokens}",
        "rollout.ignore_eos=true",
        f"control.patience={args.steps + 1}",
        f"schedule.sparse={arm == 'sparse'}".lower(),
        "pipeline.keep_checkpoints=1",
        "pipeline.report=false",
    ]
    if not args.smoke:
        sets += [
            f"schedule.name={args.schedule}",
            "rollout.gpu_memory_utilization=0.88",
            f"rollout.max_batch_size={max(64, args.prompts * args.samples)}",
        ]
    return sets + list(args.set)


def run_child(overrides: list[str]) -> None:
    """One arm: the train flow in this process; its summary as the last line."""
    from sparrow.flows.train import train_flow

    summary = train_flow(overrides, show_table=True)
    print("SUMMARY " + json.dumps({k: summary[k] for k in ("run_id", "workdir", "status")}))


def run_arm(args, arm: str, new_tokens: int, path: str) -> dict[str, Any]:
    """An arm's metrics; an arm already finished under --workdir (done.json) is read back,
    so a long case can be spread over several invocations."""
    overrides = arm_overrides(args, arm, new_tokens, path)
    work = Path(args.workdir) / f"{arm}-{new_tokens}"
    done_file = work / "done.json"
    if not done_file.exists():
        command = [sys.executable, __file__, "--child", json.dumps(overrides)]
        # the child's output goes to a file as it runs, so a long arm can be watched (and a
        # cut one read) while it runs
        work.mkdir(parents=True, exist_ok=True)
        log = work / "child.log"
        with log.open("w") as out:
            done = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        text = log.read_text(errors="replace")
        sys.stderr.write(text[-10000:])
        lines = [ln for ln in text.splitlines() if ln.startswith("SUMMARY ")]
        if done.returncode or not lines:
            raise SystemExit(f"arm {arm} at {new_tokens} tokens failed (exit {done.returncode})")
        done_file.write_text(lines[-1][len("SUMMARY ") :])
        if not args.keep_runs:
            # the trainer's folders are ~20 GB a step at 1.7B; the metrics are in DuckDB
            shutil.rmtree(work / "runs", ignore_errors=True)
    summary = json.loads(done_file.read_text())
    return arm_metrics(summary["workdir"], summary["run_id"], args.steps)


def arm_metrics(workdir: str, run_id: str, steps: int) -> dict[str, Any]:
    from sparrow.storage.report_rows import step_metric_rows

    rows = step_metric_rows(workdir, run_id)
    timed = [s for s in range(2, steps + 1)] or [1]

    def mean(name: str) -> float | None:
        values = [
            r["value"]
            for r in rows
            if r["name"] == name and r["step"] in timed and r["value"] is not None
        ]
        return sum(values) / len(values) if values else None

    peaks = [r["value"] for r in rows if r["name"].startswith("memory/") and r["value"]]
    stage_s = {stage: mean(f"time/{stage}_s") for stage in STAGES}
    return {
        "stage_s": stage_s,
        "step_s": sum(v for v in stage_s.values() if v),
        "rollout_generate_s": mean("time/rollout_generate_s"),
        # the hand-over before generate: the trainer's release (offload), the engines' wake
        "rollout_release_s": mean("time/rollout_release_s"),
        "rollout_engine_wake_s": mean("time/rollout_engine_wake_s"),
        "rollout_capture_s": mean("time/rollout_capture_s"),
        "rollout_graphs_kept": mean("rollout/graphs_kept"),
        "dense_forward_s": mean("time/dense_forward_s"),
        "update_compute_s": mean("time/update_compute_s"),
        "update_save_s": mean("time/update_save_s"),
        "sync_copy_s": mean("time/sync_copy_s"),
        "rollout_tokens_per_s": mean("rollout/tokens_per_s"),
        "tokens": mean("rollout/tokens"),
        "min_p5": mean("mismatch/min_p5"),
        "peak_memory_gib": max(peaks) if peaks else None,
        "timed_steps": timed,
    }


def model_flops(path: str, tokens_per_sequence: list[int]) -> float:
    """Forward FLOPs over these sequences (module doc)."""
    from sparrow.model.builtin import resolve_model_path
    from sparrow.model.loader import read_arch

    arch = read_arch(resolve_model_path(path))
    h, q, kv, d = arch.hidden_size, arch.num_q_heads, arch.num_kv_heads, arch.head_dim
    per_layer = h * (q * d) * 2 + h * (kv * d) * 2 + 3 * h * arch.intermediate_size
    matmul = arch.num_layers * per_layer + arch.vocab_size * h
    attention = sum(4 * arch.num_layers * q * d * t * t / 2 for t in tokens_per_sequence)
    return 2 * matmul * sum(tokens_per_sequence) + attention


def peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def case(args, new_tokens: int, path: str) -> dict[str, Any]:
    arms = {arm: run_arm(args, arm, new_tokens, path) for arm in args.arms.split(",")}
    dense, sparse = arms.get("dense"), arms.get("sparse")
    prompt = prompt_tokens(path, args)
    flops = model_flops(path, [prompt + new_tokens] * (args.prompts * args.samples))
    peak = peak_flops()
    reference = dense or sparse

    def mfu(seconds, factor):
        return None if not (peak and seconds) else factor * flops / seconds / peak

    out = {
        "new_tokens": new_tokens,
        "batch": args.prompts * args.samples,
        "arms": arms,
        "prompt_tokens": prompt,
        "mfu_score": mfu(reference["dense_forward_s"], 1),
        "mfu_update": mfu(reference["update_compute_s"], 3),
        "peak_memory_gib": max((a["peak_memory_gib"] or 0) for a in arms.values()) or None,
    }
    if dense and sparse:
        out["rollout_speedup"] = dense["stage_s"]["rollout"] / sparse["stage_s"]["rollout"]
        out["step_speedup"] = dense["step_s"] / sparse["step_s"]
    return out


def prompt_tokens(path: str, args) -> int:
    """Mean prompt length of the synthetic prompts the flow uses (for the FLOP count)."""
    from sparrow.config import load_config
    from sparrow.data.datasets import load_prompts
    from sparrow.model import load_tokenizer
    from sparrow.model.builtin import resolve_model_path

    cfg = load_config([f"model.path={path}"])
    data = load_prompts(
        cfg.data.train,
        cfg.data.prompt_key,
        cfg.data.answer_key,
        load_tokenizer(resolve_model_path(path)),
        cfg.data.max_prompt_tokens,
        split="train",
        seed=cfg.pipeline.seed,
    )
    rows = data.batch(0, args.prompts)
    return round(sum(len(r.prompt_ids) for r in rows) / len(rows))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0
    if args.smoke:
        args.new_tokens, args.prompts, args.samples, args.steps = "24", 2, 2, 2
    from benchmarks.common import device_facts, write_json

    path = model_path(args)
    cases = [case(args, int(n), path) for n in args.new_tokens.split(",")]
    write_json(
        args.out,
        {
            "facts": device_facts(),
            "benchmark": "rl_step",
            "model": path,
            "schedule": args.schedule,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
