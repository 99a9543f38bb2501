"""One RL step on 1 GPU against 2 GPUs: a trainer group (FSDP2 ranks as Ray actors) with one
colocated rollout engine per GPU; rollout, scoring, update and weight sync timed per step,
each with its breakdown.

    python benchmarks/multi_gpu.py --out results/multi_gpu.json          # 2 GPUs of one host
    python benchmarks/multi_gpu.py --gpus 1 --out results/arm1.json      # one arm per call
    python benchmarks/multi_gpu.py --prompts 16 --work-item-prompts 2    # the first GPU run's case
    python benchmarks/multi_gpu.py --gpus 2 --min-new-tokens 128         # uneven lengths:
    python benchmarks/multi_gpu.py --gpus 2 --min-new-tokens 128 --work-item-prompts 32
                                        # engines taking prompts as they run / fixed halves
    python benchmarks/multi_gpu.py --smoke          # the same code on CPU (gloo), tiny model
    python benchmarks/multi_gpu.py --merge arm1.json arm2.json --out both.json   # one report

Model: random weights of Qwen3-1.7B's shapes (hidden 2048, 16 q / 8 kv heads, head dim 128,
MLP 6144, tied embeddings, vocabulary 151,936) with --layers decoder layers (8 by default).
Batch: --prompts random prompts of --prompt-tokens tokens x --samples samples, eos off so every
sample runs to --new-tokens. The default, 64 prompts x 8 samples with engines of at most
--max-batch 256 sequences, is a case where a second GPU has work to take: one engine decodes
its 512 samples in two waves of 256 (2 x 1,024 decode steps), two engines one wave each. With
--prompts 16 (128 samples, one wave on one engine) decode is bound by the number of steps,
not the batch, and 2 GPUs can gain little in the rollout. With two or more engines they take
prompts as they run (sparrow/runtime/rollout/dispatch.py); --work-item-prompts > 0 cuts the prompts
into separate items of that many prompts instead (rollout.work_item_prompts; prompts / GPUs
gives each engine its fixed half, the dispatch before the engines took prompts as they ran;
2 is what the first GPU run's dispatch did at 16 prompts). --min-new-tokens draws each
prompt's budget in [that, --new-tokens] (seeded), so samples end at uneven steps as with eos
on (measured at 28 layers: the two dispatches level, docs/multi_gpu.md).
Each arm is a child process with its own local Ray holding --gpus GPUs (rollout.placement
colocated: trainer rank i and engine i share GPU i; the engine's KV cache is freed while the
trainer works). The first step is warm-up; the JSON holds every step and the mean of the rest.
Per step, besides each phase's wall time: `rollout` (the driver's wake, generate and sleep;
per engine its busy time as the dispatch saw it, its time inside the engine, CUDA graph
captures, KV cache allocation, items, samples and decode steps), `score_ranks` and
`update_ranks` (each rank's own seconds; the wall less these is Ray's share), and `sync`
(sparrow/runtime/rollout/weight_sync.py's phases: gather and pack on the ranks, transfer, each engine's load).
Needs ray (no Prefect, DuckDB or MLflow).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE_17B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    num_q_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=6144,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    max_position_embeddings=40_960,
)
SMOKE = dict(
    vocab_size=384,
    hidden_size=64,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU ranks (gloo)")
    parser.add_argument("--gpus", default="1,2", help="arms: GPUs (CPU ranks with --smoke)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument(
        "--min-new-tokens",
        type=int,
        default=0,
        help="> 0: each prompt's budget drawn in [this, --new-tokens] (seeded), "
        "samples of uneven length as with eos on",
    )
    parser.add_argument("--steps", type=int, default=3, help="steps per arm; the first warms up")
    parser.add_argument("--max-batch", type=int, default=256, help="most sequences per engine")
    parser.add_argument(
        "--work-item-prompts",
        type=int,
        default=0,
        help="prompts per work item; 0: one item per engine",
    )
    parser.add_argument("--kv-cache-mib", type=int, default=16384)
    parser.add_argument("--bucket-mib", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute layers in the backward (trainer.gradient_checkpointing)",
    )
    parser.add_argument(
        "--no-keep-graphs",
        action="store_true",
        help="engines capture their decode graphs again after every wake "
        "(rollout.keep_graphs=false)",
    )
    parser.add_argument("--workdir", default="/tmp/sparrow-multi-gpu")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="join the arms of separate calls (the same case) into one report",
    )
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.prompts, args.samples = 2, 4, 2
        args.prompt_tokens, args.new_tokens, args.steps, args.kv_cache_mib = 8, 16, 2, 64
    return args


def build_model(args) -> Path:
    from sparrow.model.random_checkpoint import make_random_checkpoint

    shape = SMOKE if args.smoke else SHAPE_17B
    folder = Path(args.workdir) / f"model-{args.layers}-{shape['vocab_size']}"
    if not (folder / "config.json").is_file():
        make_random_checkpoint(folder, "qwen3", num_layers=args.layers, **shape)
    return folder


def records_of(prompts, results):
    from sparrow.data.rollouts import RolloutRecord

    return [
        RolloutRecord(
            p,
            s.sample_index,
            p,
            tuple(prompt),
            tuple(s.output_ids),
            tuple(s.logprobs),
            s.topk_ids,
            s.topk_logprobs,
            tuple(s.pages_read),
            s.finish_reason,
            "0",
        )
        for p, (prompt, samples) in enumerate(zip(prompts, results))
        for s in samples
    ]


def rollout(pool, prompts, params) -> tuple[list, dict]:
    """The engines wake, generate and sleep; the driver's phases and each engine's stats."""
    times: dict = {}
    clock = time.perf_counter()
    pool.wake()
    times["wake_s"] = time.perf_counter() - clock
    results = pool.generate(prompts, params)
    times["generate_s"] = time.perf_counter() - clock - times["wake_s"]
    pool.sleep()
    times["seconds"] = time.perf_counter() - clock
    dispatched = pool.last_dispatch
    times["engines"] = [
        {**stats, "busy_s": busy, "items": items, "prompts": count}
        for stats, busy, items, count in zip(
            pool.rollout_stats(), dispatched.busy_s, dispatched.items, dispatched.prompts
        )
    ]
    return results, times


def one_step(group, pool, prompts, params, args) -> dict:
    from sparrow.runtime.rollout.weight_sync import sync_group_to_pool

    times: dict = {}
    group.free_gradients()
    results, times["rollout"] = rollout(pool, prompts, params)
    times["rollout_s"] = times["rollout"]["seconds"]
    records = records_of(prompts, results)
    clock = time.perf_counter()
    scores = group.score(records)
    times["score_s"] = time.perf_counter() - clock
    rewards = [random.Random(i).random() for i in range(len(records))]
    clock = time.perf_counter()
    metrics = group.update(records, rewards, [s.dense_logprobs for s in scores], args.samples)
    times["update_s"] = time.perf_counter() - clock
    ranks = group.rank_seconds()
    times["score_ranks"] = [r["score"] for r in ranks]
    times["update_ranks"] = [r["update"] for r in ranks]
    clock = time.perf_counter()
    modes = sync_group_to_pool(group, pool, str(group.spec.model_path), args.bucket_mib << 20)
    times["sync_s"] = time.perf_counter() - clock
    times["sync"] = dict(group.last_sync)
    times["step_s"] = sum(times[k] for k in ("rollout_s", "score_s", "update_s", "sync_s"))
    times.update(summary(times))
    times["generated_tokens"] = float(sum(len(r.output_ids) for r in records))
    times["loss"] = metrics["actor/loss"]
    times["sync_modes"] = modes
    return times


def summary(step: dict) -> dict[str, float]:
    """Flat numbers of one step's breakdown, the ones the mean is taken of."""
    engines, sync = step["rollout"]["engines"], step["sync"]
    return {
        "rollout_wake_s": step["rollout"]["wake_s"],
        "rollout_generate_s": step["rollout"]["generate_s"],
        # the busiest engine (from handing it work to its results back) and its time inside
        # the engine: against generate_s they say whether the engines ran side by side
        "rollout_engine_busy_max_s": max(e["busy_s"] for e in engines),
        "rollout_engine_inside_max_s": max(e.get("seconds", 0.0) for e in engines),
        "rollout_capture_max_s": max(e.get("capture_s", 0.0) for e in engines),
        "rollout_decode_steps_max": float(max(e.get("decode_steps", 0) for e in engines)),
        "score_rank_max_s": max(step["score_ranks"]),
        "update_rank_max_s": max(step["update_ranks"]),
        "sync_connect_s": sync["connect_s"],
        "sync_gather_s": sync["gather_s"],
        "sync_pack_s": sync["pack_s"],
        "sync_transfer_s": sync["transfer_s"],
        "sync_load_max_s": max(e["load_s"] for e in sync["engines"]),
    }


def mean_of(steps: list[dict]) -> dict[str, float]:
    """Per flat number of the steps (not the loss or token count), its mean."""
    skip = {"loss", "generated_tokens"}
    keys = [k for k, v in steps[0].items() if isinstance(v, float) and k not in skip]
    return {k: sum(s[k] for s in steps) / len(steps) for k in keys}


def run_arm(args, ranks: int) -> dict:
    import ray

    from sparrow.config.schema import AlgoConfig, RolloutConfig, TrainerConfig
    from sparrow.engine import EngineConfig, SamplingParams
    from sparrow.runtime.placement import plan_placement
    from sparrow.runtime.rollout.actors import ActorPool
    from sparrow.runtime.rollout.worker import WorkerSpec
    from sparrow.runtime.trainer_group.group import TrainerGroup
    from sparrow.runtime.trainer_group.rank import TrainerSpec

    model = build_model(args)
    use_gpu = not args.smoke
    ray.init(num_gpus=ranks if use_gpu else 0, include_dashboard=False, log_to_driver=False)
    plan = plan_placement(ranks, "colocated", ranks, use_gpu)  # one engine per rank
    dtype = "bfloat16" if use_gpu else "float32"
    rollout_config = RolloutConfig(
        kv_cache_mib=args.kv_cache_mib,
        ignore_eos=True,
        max_batch_size=args.max_batch,
        keep_graphs=not args.no_keep_graphs,
    )
    engine = EngineConfig.from_rollout(
        rollout_config, max_context=args.prompt_tokens + args.new_tokens
    )
    worker = WorkerSpec(str(model), str(model), None, engine, device=plan.device, dtype=dtype)
    pool = ActorPool.start(
        worker,
        len(plan.engines),
        plan.engines[0],
        plan.engines,
        work_item_prompts=args.work_item_prompts,
    )
    trainer_config = TrainerConfig(
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    spec = TrainerSpec(
        str(model), AlgoConfig(lr=1e-6), trainer_config, dtype="auto", device=plan.device
    )
    group = TrainerGroup.start(spec, ranks, plan.trainer)
    rng = random.Random(0)
    vocab = (SMOKE if args.smoke else SHAPE_17B)["vocab_size"]
    prompts = [[rng.randrange(300) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    params = [
        SamplingParams(max_new_tokens=budget, n=args.samples, seed=i)
        for i, budget in enumerate(token_budgets(args))
    ]
    steps = [one_step(group, pool, prompts, params, args) for _ in range(args.steps)]
    group.shutdown()
    pool.shutdown()
    return {
        "ranks": ranks,
        "device": plan.device,
        "vocab": vocab,
        "steps": steps,
        "mean": mean_of(steps[1:] or steps),
    }


def token_budgets(args) -> list[int]:
    """Each prompt's max_new_tokens: --new-tokens, or with --min-new-tokens a seeded draw."""
    if args.min_new_tokens <= 0:
        return [args.new_tokens] * args.prompts
    rng = random.Random(1)
    return [
        rng.randint(min(args.min_new_tokens, args.new_tokens), args.new_tokens)
        for _ in range(args.prompts)
    ]


CASE_KEYS = (
    "layers",
    "prompts",
    "samples",
    "prompt_tokens",
    "new_tokens",
    "min_new_tokens",
    "max_batch",
    "work_item_prompts",
    "kv_cache_mib",
    "micro_batch_tokens",
    "gradient_checkpointing",
    "no_keep_graphs",
)


def report_of(case: dict, arms: list[dict], facts) -> dict:
    """The JSON report: the case, the arms and, with two or more that ran, the first's mean
    step time over the last's (`step_speedup`) and, per later arm, the first's mean over its
    own for the step and each stage (`speedup`)."""
    report = {"benchmark": "multi_gpu", "facts": facts, **case, "arms": arms}
    ok = [a for a in arms if "mean" in a]
    if len(ok) >= 2:
        report["step_speedup"] = ok[0]["mean"]["step_s"] / ok[-1]["mean"]["step_s"]
        for arm in ok[1:]:
            arm["speedup"] = {
                k: ok[0]["mean"][k] / arm["mean"][k]
                for k in ("step_s", "rollout_s", "score_s", "update_s")
            }
    return report


def merge(paths: list[str]) -> dict:
    """Arms of separate calls (one arm each, e.g. --gpus 1 then --gpus 2) as one report, in
    order of their rank counts; the runs must share the case."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    cases = {tuple(run.get(k) for k in CASE_KEYS) for run in runs}
    if len(cases) > 1:
        raise SystemExit(
            f"--merge: the runs differ in their case ({', '.join(CASE_KEYS)}): {sorted(cases)}"
        )
    arms = sorted((arm for run in runs for arm in run["arms"]), key=lambda a: a["ranks"])
    report = report_of(
        {k: runs[0].get(k) for k in CASE_KEYS}, arms, [run.get("facts") for run in runs]
    )
    report["merged_from"] = list(paths)
    return report


def main(argv=None) -> dict:
    from benchmarks.common import device_facts, write_json

    args = parse_args(argv)
    if args.merge:
        report = merge(args.merge)
        write_json(args.out, report)
        return report
    if args.child:
        print(json.dumps(run_arm(args, args.child)))
        return {}
    build_model(args)  # once, before the arms
    arms = []
    for ranks in [int(g) for g in args.gpus.split(",")]:
        command = [
            sys.executable,
            __file__,
            *(argv if argv is not None else sys.argv[1:]),
            "--child",
            str(ranks),
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
        if done.returncode != 0:
            arms.append({"ranks": ranks, "error": done.stderr[-4000:]})
            continue
        arms.append(json.loads(done.stdout.strip().splitlines()[-1]))
    report = report_of({k: getattr(args, k) for k in CASE_KEYS}, arms, device_facts())
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
