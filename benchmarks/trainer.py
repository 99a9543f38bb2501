"""The trainer's two stages alone (dense scoring and the policy update) at 1.7B shape: seconds,
MFU, peak memory, and where the time goes (torch.profiler's top CUDA and CPU operators).

    python benchmarks/trainer.py --model /tmp/rl/w/qwen3-1.7b-shape-28l --tokens 8192 --seqs 4
    python benchmarks/trainer.py --smoke            # tiny model on CPU, seconds

Records are made up (random prompt and output ids, a random actor top-20) of the lengths the
flow would give the trainer; rewards alternate so advantages are not zero. FLOPs as in
benchmarks/rl_step.py (model_flops); the update counts three forwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import device_facts, write_json  # noqa: E402
from benchmarks.rl_step import model_flops, peak_flops  # noqa: E402
from sparrow.config.schema import AlgoConfig, TrainerConfig  # noqa: E402
from sparrow.data.rollouts import RolloutRecord  # noqa: E402
from sparrow.trainer.policy_trainer import PolicyTrainer  # noqa: E402


def make_records(seqs: int, prompt: int, tokens: int, vocab: int, topk: int = 20):
    rng = random.Random(0)
    records = []
    for i in range(seqs):
        prompt_ids = tuple(rng.randrange(vocab) for _ in range(prompt))
        out = tuple(rng.randrange(vocab) for _ in range(tokens))
        ids = tuple(tuple(rng.randrange(vocab) for _ in range(topk)) for _ in range(tokens))
        logprobs = ((-3.0,) * topk,) * tokens
        records.append(
            RolloutRecord(
                i // 2,
                i % 2,
                i // 2,
                prompt_ids,
                out,
                (-2.0,) * tokens,
                ids,
                logprobs,
                (1,) * tokens,
                "length",
                "",
            )
        )
    return records


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    clock = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return result, time.perf_counter() - clock, peak


def profile_table(fn, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    with profile(activities=activities) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def settings(items: list[str]) -> tuple[dict, dict]:
    """`KEY=VALUE` items as (AlgoConfig changes, TrainerConfig changes); a key of neither is
    an error."""
    changes: dict[type, dict] = {AlgoConfig: {}, TrainerConfig: {}}
    for item in items:
        key, _, value = item.partition("=")
        owners = [cls for cls in changes if key in {f.name for f in dataclasses.fields(cls)}]
        if not owners:
            raise SystemExit(f"--set {key}: not a TrainerConfig or AlgoConfig field")
        cls = owners[0]
        field = {f.name: f for f in dataclasses.fields(cls)}[key]
        if "bool" in str(field.type):
            changes[cls][key] = value.lower() == "true"
        else:
            changes[cls][key] = type(getattr(cls(), key))(value)
    return changes[AlgoConfig], changes[TrainerConfig]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=160)
    parser.add_argument("--seqs", type=int, default=4)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="TrainerConfig or AlgoConfig fields (e.g. gradient_checkpointing=true)",
    )
    parser.add_argument("--profile", type=int, default=25, help="rows of the profile; 0 none")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.prompt, args.seqs = 24, 8, 2
    algo_changes, trainer_changes = settings(args.set)
    algo = AlgoConfig(lr=1e-6, **algo_changes)
    trainer = PolicyTrainer(
        args.model,
        algo,
        device="auto",
        dtype="auto",
        trainer_config=TrainerConfig(**trainer_changes),
    )
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    records = make_records(args.seqs, args.prompt, args.tokens, vocab)
    rewards = [float(i % 2) for i in range(len(records))]
    # warm up kernels, the allocator, the optimizer's state and (compile_layers) the compiled
    # forward and backward, on the first group of two records
    warm = trainer.score(records[:2])
    trainer.update(records[:2], rewards[:2], [s.dense_logprobs for s in warm], 2)
    scores, score_s, score_peak = timed(lambda: trainer.score(records))
    old = [s.dense_logprobs for s in scores]
    _, update_s, update_peak = timed(lambda: trainer.update(records, rewards, old, 2))
    flops = model_flops(args.model, [args.prompt + args.tokens] * args.seqs)
    peak = peak_flops()
    result = {
        "facts": device_facts(),
        "benchmark": "trainer",
        "model": args.model,
        "tokens": args.tokens,
        "seqs": args.seqs,
        "algo": algo_changes,
        "trainer": trainer_changes,
        "score_s": score_s,
        "update_s": update_s,
        "score_peak_gib": score_peak,
        "update_peak_gib": update_peak,
        "mfu_score": flops / score_s / peak if peak else None,
        "mfu_update": 3 * flops / update_s / peak if peak else None,
    }
    if args.profile:
        result["score_profile"] = profile_table(lambda: trainer.score(records), args.profile)
        result["update_profile"] = profile_table(
            lambda: trainer.update(records, rewards, old, 2), args.profile
        )
    write_json(args.out, {k: v for k, v in result.items() if not k.endswith("_profile")})
    for key in ("score_profile", "update_profile"):
        if key in result:
            print(f"== {key}\n{result[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
