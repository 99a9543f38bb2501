"""The paper's throughput table on our machines: Qwen3-1.7B, 4B and 8B shapes, dense against
sparse rollout, one RL step through the real train flow on N GPUs, beside the paper's row.

    python benchmarks/paper_table.py --gpus 4 --sizes 1.7b --out results/paper_1.7b.json
    python benchmarks/paper_table.py --gpus 4 --sizes 8b --layers 4 --new-tokens 4096  # quick
    python benchmarks/paper_table.py --merge paper_1.7b.json paper_4b.json --out table.json
    python benchmarks/paper_table.py --smoke        # CPU: tiny model, 2 gloo ranks, 2 engines

Each size is rl_step.py's case (its arms, one `train_flow` process each, metrics read back from
the run's DuckDB) with a trainer group: trainer.num_workers=--gpus FSDP2 ranks, one colocated
engine per GPU (rollout.placement=colocated), the weights synced over NCCL (CUDA IPC to the
engine on rank 0's GPU), the ranks' state offloaded during the rollout through a page-locked
buffer made when the trainer is built (sparrow/trainer/offload.py) and activations
recomputed in the backward. Models: random weights of each size's real decoder shape and
vocabulary (151,936), written once under --workdir/models; --layers N cuts the depth for quick
checks (0: the real depth). Batch: --prompts x --samples (8 x 8 = 64 sequences, the paper's
AIME24 x 8) of the synthetic task, eos off, every sample run to --new-tokens. Schedules: the
paper presets qwen3-<size>-0.86. Steps are timed from step 2 (the first in steady state:
the offload's buffer is pinned in step 1, as are the compiles); step 1's stage seconds are
reported apart (`step1`). Where this departs from the paper: random weights with eos off run
every sample to the cutoff (AIME samples stop early, so their batches thin out), H100s
rather than H200s, and the synthetic prompts' lengths.
Per size: rollout tokens/s in total and per GPU, rollout (stage) and step speedups, per-stage
seconds, MFU of scoring and the update over the N GPUs' bf16 peak, the engines' peak memory,
the sync's seconds and phases, and the paper's row (`paper`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rl_step  # noqa: E402 - the case runner this table extends

_QWEN3 = dict(
    vocab_size=151_936,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=1_000_000.0,
    max_position_embeddings=40_960,
)
# the decoder shapes of Qwen3-1.7B, 4B and 8B (their config.json files)
SHAPES = {
    "1.7b": dict(
        _QWEN3,
        hidden_size=2048,
        num_layers=28,
        num_q_heads=16,
        intermediate_size=6144,
        tie_word_embeddings=True,
    ),
    "4b": dict(
        _QWEN3,
        hidden_size=2560,
        num_layers=36,
        num_q_heads=32,
        intermediate_size=9728,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        _QWEN3,
        hidden_size=4096,
        num_layers=36,
        num_q_heads=32,
        intermediate_size=12288,
        tie_word_embeddings=False,
    ),
}
# the paper's table: 4 x H200, AIME24 x 8 samples, 32K cutoff; rollout tokens/s in total
PAPER_SETUP = "4 x H200, AIME24 x 8 samples, 32K cutoff"
PAPER = {
    "1.7b": dict(dense_tok_s=2561, sparse_tok_s=5662, rollout_speedup=2.21, step_speedup=1.97),
    "4b": dict(dense_tok_s=1369, sparse_tok_s=3308, rollout_speedup=2.41, step_speedup=2.11),
    "8b": dict(dense_tok_s=1300, sparse_tok_s=2682, rollout_speedup=2.06, step_speedup=1.81),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, CPU ranks, short")
    parser.add_argument("--sizes", default="1.7b,4b,8b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--gpus", type=int, default=4, help="trainer ranks = engines = GPUs")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers; 0: real depth")
    parser.add_argument("--new-tokens", type=int, default=32768)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="steps per arm (timed from 2 on)")
    parser.add_argument("--arms", default="dense,sparse")
    parser.add_argument("--workdir", default="/tmp/sparrow-paper-table")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep-runs", action="store_true", help="keep each arm's run folders")
    parser.add_argument("--out", default=None)
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON")
    args = parser.parse_args(argv)
    unknown = set(args.sizes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"--sizes: unknown {sorted(unknown)}; known: {', '.join(SHAPES)}")
    if args.smoke:
        args.sizes, args.gpus, args.new_tokens = "1.7b", 2, 24
        args.prompts, args.samples, args.steps = 2, 2, 2
    return args


def build_model(args, size: str) -> str:
    """The size's random-weight checkpoint (once per depth); builtin:tiny for --smoke."""
    if args.smoke:
        return "builtin:tiny"
    from sparrow.model.random_checkpoint import make_random_checkpoint

    shape = dict(SHAPES[size])
    shape["num_layers"] = args.layers or shape["num_layers"]
    folder = Path(args.workdir) / "models" / f"qwen3-{size}-shape-{shape['num_layers']}l"
    if not list(folder.glob("*.safetensors")):
        make_random_checkpoint(folder, "qwen3", seed=0, **shape)
    return str(folder)


def group_overrides(args) -> list[str]:
    """The flow's settings for N GPUs: a trainer group with a colocated engine per rank."""
    return [
        f"trainer.num_workers={args.gpus}",
        f"rollout.num_actors={args.gpus}",
        "rollout.placement=colocated",
        "trainer.offload_during_rollout=true",
        "trainer.gradient_checkpointing=true",
    ]


def case_args(args, size: str) -> argparse.Namespace:
    """rl_step's arguments for this size (its own workdir, schedule and overrides)."""
    depth = args.layers or SHAPES[size]["num_layers"]
    return argparse.Namespace(
        smoke=args.smoke,
        prompts=args.prompts,
        samples=args.samples,
        steps=args.steps,
        arms=args.arms,
        schedule=f"qwen3-{size}-0.86",
        layers=depth,
        workdir=str(Path(args.workdir) / f"{size}-{depth}l-{args.gpus}gpu"),
        set=group_overrides(args) + list(args.set),
        keep_runs=args.keep_runs,
    )


def size_row(args, size: str) -> dict[str, Any]:
    """rl_step's case for this size, with the group's figures and the paper's row."""
    sized = case_args(args, size)
    path = build_model(args, size)
    case = rl_step.case(sized, args.new_tokens, path)
    for arm, stats in case["arms"].items():
        done = Path(sized.workdir) / f"{arm}-{args.new_tokens}" / "done.json"
        summary = json.loads(done.read_text())
        stats.update(extra_metrics(summary["workdir"], summary["run_id"], args.steps))
        tokens_per_s = stats.get("rollout_tokens_per_s")
        stats["rollout_tokens_per_s_per_gpu"] = tokens_per_s / args.gpus if tokens_per_s else None
    for key in ("mfu_score", "mfu_update"):  # rl_step divides by one GPU's peak
        if case.get(key) is not None:
            case[key] /= args.gpus
    dense, sparse = case["arms"].get("dense"), case["arms"].get("sparse")
    if dense and sparse and dense["rollout_tokens_per_s"] and sparse["rollout_tokens_per_s"]:
        case["generate_speedup"] = sparse["rollout_tokens_per_s"] / dense["rollout_tokens_per_s"]
    return {
        "size": size,
        "layers": sized.layers,
        "gpus": args.gpus,
        "schedule": sized.schedule,
        "model": path,
        **case,
        "paper": {**PAPER[size], "setup": PAPER_SETUP},
    }


def extra_metrics(workdir: str, run_id: str, steps: int) -> dict[str, Any]:
    """What rl_step's arm_metrics leaves out: the sync's phases (mean of the timed steps) and
    step 1's stage seconds, reported apart (compiles, the offload buffer's pinning)."""
    from sparrow.storage.report_rows import step_metric_rows

    rows = step_metric_rows(workdir, run_id)
    timed = list(range(2, steps + 1)) or [1]

    def values(name: str, in_steps) -> list[float]:
        return [
            r["value"]
            for r in rows
            if r["name"] == name and r["step"] in in_steps and r["value"] is not None
        ]

    def mean(name: str) -> float | None:
        found = values(name, timed)
        return sum(found) / len(found) if found else None

    step1 = {stage: (values(f"time/{stage}_s", [1]) or [None])[0] for stage in rl_step.STAGES}
    return {
        "sync_s": mean("time/sync_weights_s"),
        "sync_gather_s": mean("time/sync_gather_s"),
        "sync_transfer_s": mean("time/sync_transfer_s"),
        "step1": {
            "stage_s": step1,
            "step_s": sum(v for v in step1.values() if v),
            "rollout_release_s": (values("time/rollout_release_s", [1]) or [None])[0],
        },
    }


def merge(paths: list[str]) -> dict[str, Any]:
    """Sizes from separate calls (one size each, the 10-minute calls) as one table."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    rows = sorted(
        (row for run in runs for row in run["sizes"]), key=lambda r: list(SHAPES).index(r["size"])
    )
    return {
        "benchmark": "paper_table",
        "facts": [run.get("facts") for run in runs],
        "sizes": rows,
        "merged_from": list(paths),
    }


def main(argv=None) -> int:
    from benchmarks.common import device_facts, write_json

    args = parse_args(argv)
    if args.merge:
        write_json(args.out, merge(args.merge))
        return 0
    rows = [size_row(args, size) for size in args.sizes.split(",")]
    report = {
        "benchmark": "paper_table",
        "facts": device_facts(),
        "new_tokens": args.new_tokens,
        "batch": args.prompts * args.samples,
        "sizes": rows,
    }
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
